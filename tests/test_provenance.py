"""Which code made a run (mas_lab/records/provenance.py): the fingerprint, its record in a run's store and
summary, and a resume with other code recorded and said."""

import shutil

from mas_lab.records.provenance import code_version, fingerprint
from mas_lab.records.store import RunStore


def test_the_fingerprint_follows_every_byte_and_path_but_not_compiled_caches(tmp_path):
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.yaml").write_text("k: v\n")
    first = fingerprint(tmp_path)
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "a.cpython-312.pyc").write_bytes(b"\x00compiled")
    assert fingerprint(tmp_path) == first
    (tmp_path / "sub" / "b.yaml").write_text("k: w\n")
    assert fingerprint(tmp_path) != first
    (tmp_path / "sub" / "b.yaml").write_text("k: v\n")
    assert fingerprint(tmp_path) == first
    (tmp_path / "sub" / "b.yaml").rename(tmp_path / "b.yaml")  # same bytes, another place
    assert fingerprint(tmp_path) != first


def test_a_run_records_the_code_that_made_it_in_its_store_and_summary(toy_run):
    _, run_dir, summary = toy_run
    assert summary["code"] == [code_version()]
    store = RunStore(run_dir / "run.db", create=False)
    try:
        assert store.meta()["code"] == [code_version()]
    finally:
        store.close()


def test_a_run_resumed_with_other_code_records_both_and_says_so(toy_run, tmp_path, monkeypatch):
    from mas_lab import runs
    from mas_lab.records import control

    run_dir = tmp_path / "r"
    shutil.copytree(toy_run[1], run_dir)
    monkeypatch.setattr(runs, "code_version", lambda: "0123456789abcdef")
    run = runs.resume(run_dir, None, [])
    try:
        assert run.store.meta()["code"] == [code_version(), "0123456789abcdef"]
        said = [e["message"] for e in run.store.events() if e["kind"] == "code"]
        assert said == [f"resumed with mas_lab code 0123456789abcdef (until now {code_version()})"]
    finally:
        run.store.close()
        control.release_lock(run_dir)
