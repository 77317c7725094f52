"""Artifacts damaged after they were written, and disks that cannot take them: the CLI says which file, and
exits 2 or 3 with nothing half-written left (issue 36: a same-size tensor overwrite, a garbage tokenizer.json,
a read-only or full engines directory, a truncated .pyc in the model repository)."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import CONFIGS, run_cli

from trtllm_pipeline import artifacts

NAME = "tiny-qwen2-fp8-tp1"
CONFIG = str(CONFIGS / f"{NAME}.yaml")


@pytest.fixture()
def copied(built, engines_dir, tmp_path) -> Path:
    """A copy of the built tiny model's checkpoint and engine in an engines directory of its own."""
    built(NAME)
    engines = tmp_path / "engines"
    for part in ("checkpoint", "hf_checkpoint", "engine"):
        if (engines_dir / NAME / part).is_dir():
            shutil.copytree(engines_dir / NAME / part, engines / NAME / part)
    return engines


def _overwrite_a_tensor(path: Path) -> str:
    """Flip the bytes of one tensor in place, size unchanged, and put the file's mtime back (as an attacker or a
    bad copy would leave it); the tensor's name."""
    raw = path.read_bytes()
    size = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + size])
    name = next(k for k, v in header.items() if k != "__metadata__" and v["data_offsets"][1] > v["data_offsets"][0])
    start, end = (8 + size + o for o in header[name]["data_offsets"])
    st = path.stat()
    with open(path, "r+b") as f:
        f.seek(start)
        f.write(bytes(b ^ 0x5A for b in raw[start:end]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size and path.stat().st_mtime_ns == st.st_mtime_ns
    return name


def test_a_tensor_overwritten_in_place_is_named_by_build_and_generate(copied):
    rank0 = copied / NAME / "checkpoint" / "rank0.safetensors"
    tensor = _overwrite_a_tensor(rank0)
    build = run_cli("build", "-c", CONFIG, "--engines-dir", str(copied), "--runtime", "torch")
    assert build.returncode == 2 and "cache hit" not in build.stderr + build.stdout, build.stderr
    assert "rank0.safetensors" in build.stderr and tensor in build.stderr
    generate = run_cli("generate", "-c", CONFIG, "--engines-dir", str(copied), "--max-tokens", "4", "hello")
    assert generate.returncode == 2 and not generate.stdout.strip(), generate.stderr
    assert "rank0.safetensors" in generate.stderr and tensor in generate.stderr


def test_unchanged_files_are_not_read_again_and_a_copy_is_reverified(copied, monkeypatch):
    ckpt = copied / NAME / "checkpoint"
    manifest = artifacts.read_manifest(ckpt)
    assert artifacts.changed_outputs(ckpt, manifest) == {}  # a copy: new inodes, so re-hashed, and equal
    fresh = {"outputs": artifacts.hash_tree(ckpt)}
    monkeypatch.setattr(artifacts, "content_change", lambda *a: pytest.fail("an untouched file was read"))
    assert artifacts.changed_outputs(ckpt, fresh) == {}


@pytest.mark.parametrize("content", [b"", b"\x00garbage{"])
def test_a_damaged_tokenizer_json_is_named_with_exit_2(copied, content):
    path = copied / NAME / "checkpoint" / "tokenizer" / "tokenizer.json"
    path.write_bytes(content)
    proc = run_cli("generate", "-c", CONFIG, "--engines-dir", str(copied), "--max-tokens", "4", "hello")
    assert proc.returncode == 2, proc.stderr
    assert "tokenizer.json" in proc.stderr and "internal error" not in proc.stderr


def _mount_tmpfs(where: Path, size: str) -> None:
    where.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {proc.stderr.decode().strip()}")


@pytest.mark.parametrize("kind", ["read-only", "full"])
def test_an_engines_dir_that_cannot_take_the_checkpoint_fails_before_calibrating(tmp_path, kind):
    mount = tmp_path / "disk"
    _mount_tmpfs(mount, "256k")
    try:
        if kind == "read-only":
            subprocess.run(["mount", "-o", "remount,ro", str(mount)], check=True)
        proc = run_cli("quantize", "-c", CONFIG, "--engines-dir", str(mount / "engines"))
        assert proc.returncode == 2, proc.stderr
        assert ("not writable" if kind == "read-only" else "MiB free") in proc.stderr
        assert "calibrating" not in proc.stderr and "internal error" not in proc.stderr
        assert not list(mount.rglob("*.safetensors")) and not list(mount.rglob(".*tmp-*"))
    finally:
        subprocess.run(["umount", str(mount)], check=False)


def test_a_disk_that_fills_during_export_is_exit_3_naming_the_disk(tmp_path, monkeypatch):
    """The up-front estimate passes (check_room made lenient here), the disk fills while the files are written:
    a disk-full message and exit 3, and no temporary directory left behind."""
    mount = tmp_path / "disk"
    _mount_tmpfs(mount, "3m")
    try:
        proc = subprocess.run(
            [sys.executable, "-c", "import sys; from trtllm_pipeline import artifacts; "
             "artifacts.check_room = lambda *a, **k: None; from trtllm_pipeline.cli import main; "
             "sys.argv = ['trtllm-pipeline'] + sys.argv[1:]; main()",
             "quantize", "-c", CONFIG, "--engines-dir", str(mount / "engines")],
            capture_output=True, text=True, timeout=600, cwd=Path(__file__).resolve().parents[1])
        assert proc.returncode == 3, proc.stderr
        assert "the disk is full" in proc.stderr and "internal error" not in proc.stderr
        assert not [p for p in mount.rglob("*") if artifacts._TMP_MARK in p.name]
    finally:
        subprocess.run(["umount", str(mount)], check=False)
