"""DaskRunner: Dask sizes the Beam WindowedValue objects in the runner's bags by
their wrapper, not by their value.

Every GroupByKey on the DaskRunner is ReifyWindows (a ParDo that turns each
(key, value) into (key, WindowedValue)), then a Dask bag groupby over those
pairs; the shuffle's data sits in the workers' memory as such pairs. dask.sizeof
has no rule for WindowedValue and falls back to sys.getsizeof, so a 1 MB value
counts as 80 bytes in a worker's managed memory: Dask neither spills it nor
pauses the worker for it.
"""

from apache_beam.transforms.window import GlobalWindows
from dask.sizeof import sizeof

if __name__ == "__main__":
    payload = b"x" * 1_000_000
    pair = ("key", GlobalWindows.windowed_value(payload))  # as ReifyWindows makes it
    partition = [pair] * 100  # one shuffle partition of 100 MB
    print(f"sizeof(value)                     = {sizeof(payload):>11,d} bytes")
    print(f"sizeof((key, WindowedValue))      = {sizeof(pair):>11,d} bytes")
    print(f"sizeof(100 such pairs, ~100 MB)   = {sizeof(partition):>11,d} bytes")
    if sizeof(pair) < len(payload):
        print("BUG: Dask counts a WindowedValue as its wrapper, not its value")
