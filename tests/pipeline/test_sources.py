import io
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.core.sources import (
    MAX_RANGE_BYTES,
    MIN_RANGE_BYTES,
    TARGET_RANGES,
    FileRange,
    content_id,
    number_duplicates,
    range_bytes,
    read_documents,
    split_ranges,
)


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
        "invalid_json",
        "missing_text_field",
        "non_string_text",
        "empty_document",
    ]


def test_parquet_column_and_missing_column(tmp_path):
    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"text": ["Alpha beta. Delta epsilon.", None]}), path)
    out = items(path.read_bytes(), "parquet")
    assert out == [(["Alpha beta.", "Delta epsilon."], None), (None, "missing_text_field")]
    with pytest.raises(ValueError, match=r"f: no column 'body'"):
        items(path.read_bytes(), "parquet", field="body")


# ----------------------------------------------------------------------------- formats

from pipeline.core.sources import HEAD_BYTES, check_format, format_from_name, sniff_format  # noqa: E402

JSONL = b'{"id": 1, "text": "A first document."}\n{"id": 2, "text": "A second one."}\n'
TXT = b"A first sentence.\nA second one.\n\nAnother document.\n"


def test_format_from_name():
    assert format_from_name("a/docs.jsonl") == "jsonl"
    assert format_from_name("gs://b/docs.JSON.gz") == "jsonl"
    assert format_from_name("x.ndjson.zst") == "jsonl"
    assert format_from_name("x.parquet") == "parquet"
    assert format_from_name("/c/wiki.txt.bz2") == "txt"
    assert format_from_name("notes.md") is None
    assert format_from_name("README") is None
    assert format_from_name(".txt") is None  # a hidden file, not an extension


def test_sniff_format():
    assert sniff_format(JSONL) == "jsonl"
    assert sniff_format(b"\n\n  " + JSONL) == "jsonl"
    assert sniff_format(TXT) == "txt"
    assert sniff_format(b"{not json\n") == "txt"
    assert sniff_format(b"PAR1\x15\x04") == "parquet"
    assert sniff_format(b"") is None and sniff_format(b" \n\n") is None


def test_check_format_refuses_jsonl_read_as_txt_and_names_the_fix():
    with pytest.raises(
        ValueError,
        match=r"docs\.jsonl: read as txt.*JSON object.*"
        r"--input_format jsonl \(and --text_field NAME\)",
    ):
        check_format("docs.jsonl", JSONL, "txt", "--input_format txt")
    with pytest.raises(ValueError, match=r"not JSON objects.*--input_format txt"):
        check_format("a.jsonl", TXT, "jsonl", "--input_format jsonl")
    with pytest.raises(ValueError, match="one JSON array"):
        check_format("a.json", b'[{"text": "x"}]\n', "jsonl", "the extension")
    with pytest.raises(ValueError, match=r"is a Parquet file.*--input_format parquet"):
        check_format("a.txt", b"PAR1\x00\x00", "txt", "the extension")
    with pytest.raises(ValueError, match=r"not a Parquet file.*--input_format txt"):
        check_format("a.parquet", TXT, "parquet", "--input_format parquet")


def test_check_format_accepts_what_agrees():
    check_format("a", JSONL, "jsonl", "")
    check_format("a", TXT, "txt", "")
    check_format("a", b"", "parquet", "")  # empty: read (and counted) as it is
    # JSON Lines whose first record is broken is still JSON Lines (the record is a skip).
    check_format("a", b"{broken\n" + JSONL, "jsonl", "")
    # A first record longer than the head read is still taken for JSON Lines.
    long_record = b'{"text": "' + b"word " * HEAD_BYTES
    check_format("a", long_record[:HEAD_BYTES], "jsonl", "")


def test_check_utf8_refuses_a_mostly_invalid_head_and_reads_a_few_bad_lines():
    import random

    from pipeline.core.sources import HEAD_BYTES, check_utf8

    check_utf8("f", b"One a.\nTwo \xff b.\nThree c.\n")  # 1 of 3 lines bad: read
    check_utf8("f", b"A \xff.\nB.\n")  # half: read
    check_utf8("f", b"\n\n")  # nothing to judge
    with pytest.raises(ValueError, match=r"^f: 2 of the 3 lines .* not UTF-8"):
        check_utf8("f", b"A \xff.\nB.\nC \xfe.\n")
    latin1 = "Café crème.\nÀ bientôt, Zoë.\nNaïve.\n".encode("latin-1")
    with pytest.raises(ValueError, match="3 of the 3 lines"):
        check_utf8("f", latin1)
    with pytest.raises(ValueError, match="not UTF-8"):
        check_utf8("bin", random.Random(0).randbytes(HEAD_BYTES))
    # A full head may end inside a character: the cut is not an invalid line.
    cut = "é".encode() * (HEAD_BYTES // 2 - 1) + b"a\xc3"  # HEAD_BYTES, ends mid-"é"
    assert len(cut) == HEAD_BYTES
    check_utf8("f", cut)
    with pytest.raises(ValueError, match="1 of the 1 lines"):
        check_utf8("f", cut[2:])  # the whole file: a truncated character is invalid


def ranged(data: bytes, fmt: str, size: int, field="text") -> list:
    """Every range's items, in order, as the build reads a file of ``data`` split in ``size``."""
    out = []
    for part in split_ranges([("f", len(data))], size):
        out += read_documents(
            io.BytesIO(data),
            input_format=fmt,
            text_field=field,
            path="f",
            start=part.start,
            end=part.end,
        )
    return out


@pytest.mark.parametrize("size", [1, 2, 5, 13, 64, 10_000])
def test_txt_ranges_read_each_document_once(size):
    data = b"A a.\nB b.\n\n\n \nC \xff c.\nD d.\n\nE e.\n\n\n\nF f.\nG g.\nH h.\n\n\n"
    assert ranged(data, "txt", size) == items(data)


@pytest.mark.parametrize("size", [1, 3, 17, 10_000])
def test_jsonl_ranges_read_each_record_once(size):
    lines = [json.dumps({"text": f"Record {i} here. Then more."}) for i in range(9)]
    data = ("\n".join([*lines[:4], "{bad", *lines[4:]]) + "\n").encode()
    whole = items(data, "jsonl")
    assert len(whole) == 10 and (None, "invalid_json") in whole
    assert ranged(data, "jsonl", size) == whole


def test_parquet_ranges_read_each_row_group_once(tmp_path):
    path = tmp_path / "d.parquet"
    texts = [f"Row {i} says this. And that." for i in range(50)]
    pq.write_table(pa.table({"text": texts}), path, row_group_size=7)  # 8 row groups
    data = path.read_bytes()
    whole = items(data, "parquet")
    assert len(whole) == 50
    for size in (1, 100, 333, len(data)):
        assert ranged(data, "parquet", size) == whole, size


def test_split_ranges_keeps_compressed_files_whole():
    ranges = split_ranges([("a.txt", 5), ("b.txt.gz", 9), ("c.jsonl", 2)], 2)
    assert ranges == [
        FileRange("a.txt", 0, 2),
        FileRange("a.txt", 2, 4),
        FileRange("a.txt", 4, None),
        FileRange("b.txt.gz"),
        FileRange("c.jsonl"),
    ]
    assert range_bytes(15_000_000) == MIN_RANGE_BYTES
    assert range_bytes(20 * 10**9) == 20 * 10**9 // TARGET_RANGES  # 19.5 MB
    assert range_bytes(10**12) == MAX_RANGE_BYTES


def test_content_id_is_the_content_and_duplicates_are_numbered():
    a, b = content_id(["One.", "Two."]), content_id(["One.\nTwo."[:4], "Two."])
    assert a == b and a != content_id(["One. Two."]) and len(a) == 32
    assert number_duplicates(sorted([a, "x", a])) == [f"{a}:0", f"{a}:1", "x:0"]
