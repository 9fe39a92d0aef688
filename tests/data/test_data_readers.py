"""Tests for rlft.data.readers.read_rows."""

from __future__ import annotations

import json

import pytest

from rlft.data.readers import read_rows
from rlft.errors import DataError


def write(path, text):
    path.write_text(text, encoding="utf-8")
    return path


def test_jsonl_reads_rows_and_line_numbers(tmp_path):
    p = write(tmp_path / "train.jsonl", '{"prompt": "a"}\n\n{"prompt": "b", "answer": 2}\n')
    r = read_rows(p, "error")
    assert r.rows == [{"prompt": "a"}, {"prompt": "b", "answer": 2}]
    assert r.row_numbers == [1, 3]
    assert r.skipped == []


def test_json_list_and_data_key(tmp_path):
    p = write(tmp_path / "a.json", json.dumps([{"prompt": "x"}, {"prompt": "y"}]))
    assert read_rows(p).rows == [{"prompt": "x"}, {"prompt": "y"}]
    assert read_rows(p).row_numbers == [1, 2]
    q = write(tmp_path / "b.json", json.dumps({"data": [{"prompt": "z"}]}))
    assert read_rows(q).rows == [{"prompt": "z"}]


def test_json_wrong_top_level(tmp_path):
    p = write(tmp_path / "a.json", json.dumps({"rows": []}))
    with pytest.raises(DataError, match="expected a JSON list"):
        read_rows(p)


def test_json_item_not_object(tmp_path):
    p = write(tmp_path / "a.json", json.dumps([{"prompt": "x"}, 5]))
    with pytest.raises(DataError, match=r"a\.json row 2: expected a JSON object, got int"):
        read_rows(p)


def test_json_syntax_error_names_line(tmp_path):
    p = write(tmp_path / "a.json", '[\n{"prompt": "x"},\n{"prompt" "y"}\n]')
    with pytest.raises(DataError, match=r"a\.json line 3: invalid JSON"):
        read_rows(p)


def test_csv_line_numbers(tmp_path):
    p = write(tmp_path / "t.csv", 'prompt,answer\nhello,1\n"multi, comma",2\n')
    r = read_rows(p)
    assert r.rows == [{"prompt": "hello", "answer": "1"}, {"prompt": "multi, comma", "answer": "2"}]
    assert r.row_numbers == [2, 3]


def test_csv_wrong_field_count(tmp_path):
    p = write(tmp_path / "t.csv", "prompt,answer\nhello,1,extra\nok,2\n")
    with pytest.raises(DataError, match=r"t\.csv line 2: has 3 fields but the header has 2"):
        read_rows(p)
    r = read_rows(p, "skip")
    assert r.row_numbers == [3]
    assert [n for n, _ in r.skipped] == [2]


def test_parquet(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    p = tmp_path / "t.parquet"
    pq.write_table(pa.table({"prompt": ["a", "b"], "answer": [1, 2]}), p)
    r = read_rows(p)
    assert r.rows == [{"prompt": "a", "answer": 1}, {"prompt": "b", "answer": 2}]
    assert r.row_numbers == [1, 2]
    assert r.unit == "row"


def test_bad_jsonl_line_reports_file_and_line(tmp_path):
    p = write(tmp_path / "train.jsonl", '{"prompt": "a"}\n' * 6 + '{"prompt": "a" "b"}\n')
    with pytest.raises(DataError) as exc:
        read_rows(p, "error")
    msg = str(exc.value)
    assert msg.startswith(f"{p} line 7: invalid JSON (")
    assert "Expecting ',' delimiter at column" in msg


def test_jsonl_non_object_line(tmp_path):
    p = write(tmp_path / "t.jsonl", '{"prompt": "a"}\n[1, 2]\n')
    with pytest.raises(DataError, match=r"t\.jsonl line 2: expected a JSON object, got list"):
        read_rows(p)


def test_skip_mode_records_line_numbers(tmp_path):
    p = write(tmp_path / "t.jsonl", '{"prompt": "a"}\nnot json\n{"prompt": "b"}\n"str"\n')
    r = read_rows(p, "skip")
    assert len(r.rows) == 2
    assert r.row_numbers == [1, 3]
    assert [n for n, _ in r.skipped] == [2, 4]
    assert "line 2: invalid JSON" in r.skipped[0][1]


def test_unknown_extension_lists_formats(tmp_path):
    p = write(tmp_path / "t.txt", "hello")
    with pytest.raises(DataError, match=r"\.jsonl, \.json, \.csv, \.parquet"):
        read_rows(p)


def test_missing_file(tmp_path):
    with pytest.raises(DataError, match="not found"):
        read_rows(tmp_path / "nope.jsonl")


def test_a_folder_that_is_not_a_saved_dataset_is_refused(tmp_path):
    d = tmp_path / "dir.jsonl"
    d.mkdir()
    with pytest.raises(DataError, match="a folder, but not a dataset written by datasets' save_to_disk"):
        read_rows(d)


def test_empty_dataset(tmp_path):
    with pytest.raises(DataError, match="empty"):
        read_rows(write(tmp_path / "e.jsonl", "\n\n"))
    with pytest.raises(DataError, match="empty"):
        read_rows(write(tmp_path / "e.json", "[]"))
    with pytest.raises(DataError, match=r"empty.*1 malformed"):
        read_rows(write(tmp_path / "bad.jsonl", "nope\n"), "skip")


def test_invalid_utf8(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_bytes(b'{"prompt": "\xff"}\n')
    with pytest.raises(DataError, match="UTF-8"):
        read_rows(p)


def test_corrupt_parquet(tmp_path):
    p = write(tmp_path / "t.parquet", "not parquet")
    with pytest.raises(DataError, match="Parquet"):
        read_rows(p)
