import io
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.sources import read_documents


def items(data: bytes, fmt="txt", field="text"):
    return list(read_documents(io.BytesIO(data), input_format=fmt, text_field=field, path="f"))


def test_txt_documents_and_invalid_utf8_is_a_counted_skip():
    data = b"One a.\nTwo b.\n\n\n  \nThree \xff c.\nFour d.\n\n"
    out = items(data)
    assert out == [
        (["One a.", "Two b."], None),
        (None, "invalid_utf8_line"),
        (["Four d."], None),
    ]


def test_txt_empty_input():
    assert items(b"") == []
    assert items(b"\n\n  \n") == []


def test_jsonl_records_and_skips():
    lines = [
        json.dumps({"text": "First sentence here. Second one follows."}),
        "{not json",
        json.dumps({"body": "x"}),
        json.dumps({"text": 3}),
        json.dumps({"text": "   "}),
        "",
    ]
    out = items(("\n".join(lines) + "\n").encode(), "jsonl")
    assert out[0] == (["First sentence here.", "Second one follows."], None)
    assert [reason for _, reason in out[1:]] == [
        "invalid_json", "missing_text_field", "non_string_text", "empty_document",
    ]  # fmt: skip


def test_parquet_column_and_missing_column(tmp_path):
    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"text": ["Alpha beta. Delta epsilon.", None]}), path)
    out = items(path.read_bytes(), "parquet")
    assert out == [(["Alpha beta.", "Delta epsilon."], None), (None, "missing_text_field")]
    with pytest.raises(ValueError, match=r"f: no column 'body'"):
        items(path.read_bytes(), "parquet", field="body")
