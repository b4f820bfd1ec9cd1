"""A gzip-compressed plain CSV reads as the plain file does: lines end at \\n, \\r\\n or \\r
only (not at str.splitlines' \\x85, \\u2028, \\x1c...), and a quoted field keeps the line
breaks inside it, also when the reader falls back to skipping lines of spaces."""

from __future__ import annotations

import gzip

import pytest

from llmsched.workload.trace import read_trace

HEADER = "arrival_s,prompt_tokens,output_tokens,tag\n"
CASES = {
    "quoted newline": HEADER + '0.1,10,5,"x\ny"\n',
    "unicode breaks": HEADER + "0.1,10,5,a\x85b\n0.2,10,5,c\u2028d\n0.3,10,5,e\x1cf\n",
    "crlf and quoted crlf": HEADER.replace("\n", "\r\n") + '0.1,10,5,a\r\n0.2,10,5,"p\r\nq"\r\n',
    "a line of spaces and a quoted blank line": HEADER + '0.1,10,5,a\n  ,  \n0.2,10,5,"u\n\nv"\n',
}


@pytest.mark.parametrize("text", CASES.values(), ids=CASES.keys())
def test_gzip_copy_reads_as_the_plain_file(tmp_path, text):
    plain = tmp_path / "t.csv"
    plain.write_bytes(text.encode())
    gz = tmp_path / "t.csv.gz"
    gz.write_bytes(gzip.compress(text.encode()))
    a, b = read_trace(plain), read_trace(gz)
    assert a.tag.tolist() == b.tag.tolist()
    assert a.arrival_s.tolist() == b.arrival_s.tolist()
    assert a.prompt.tolist() == b.prompt.tolist()


def test_the_tags_read_are_the_files(tmp_path):
    gz = tmp_path / "t.csv.gz"
    gz.write_bytes(gzip.compress((HEADER + '0.1,10,5,"x\ny"\n0.2,10,5,a\x85b\n').encode()))
    assert read_trace(gz).tag.tolist() == ["x\ny", "a\x85b"]
    gz.write_bytes(gzip.compress(CASES["a line of spaces and a quoted blank line"].encode()))
    assert read_trace(gz).tag.tolist() == ["a", "u\n\nv"]
