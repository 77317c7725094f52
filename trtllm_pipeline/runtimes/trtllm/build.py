"""trtllm-build, run: the engine directory written atomically, its log kept, its layout checked.

A failed build leaves the previous engine directory as it was and its log beside it
(``trtllm-build.failed.log``), with the log's last lines in the error.
"""

from __future__ import annotations

import collections
import logging
import os
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

from trtllm_pipeline import artifacts
from trtllm_pipeline.errors import Problem, StageFailed, UnavailableError, bullets
from trtllm_pipeline.machine import trtllm_status
from trtllm_pipeline.runtimes.trtllm.commands import read_engine_config, trtllm_build_command
from trtllm_pipeline.runtimes.trtllm.preflight import preflight

if TYPE_CHECKING:
    from trtllm_pipeline.config import BuildConfig

log = logging.getLogger(__name__)

ENGINE_CONFIG_KEYS = ("pretrained_config", "build_config")
BUILD_LOG = "trtllm-build.log"
FAILED_BUILD_LOG = "trtllm-build.failed.log"  # beside the engine directory, which a failure leaves untouched


def engine_layout_problems(engine_dir: Path, world: int) -> list[str]:
    """What is missing from a trtllm-build output directory (config.json keys, rank{i}.engine files)."""
    try:
        config = read_engine_config(engine_dir)
    except (OSError, ValueError) as exc:
        return [f"{engine_dir}/config.json is missing or unreadable ({exc})"]
    problems = [f"config.json lacks `{k}`" for k in ENGINE_CONFIG_KEYS if k not in config]
    problems += [f"rank{r}.engine is missing" for r in range(world)
                 if not (engine_dir / f"rank{r}.engine").is_file()]
    return problems


def build_engine(cfg: "BuildConfig", checkpoint_dir: str | os.PathLike, engine_dir: str | os.PathLike) -> dict:
    """Run trtllm-build into ``engine_dir`` (atomically) and return the manifest fields it adds.

    Raises ``UnavailableError`` listing the pre-flight problems, ``StageFailed`` with the log tail
    when trtllm-build fails or leaves an incomplete engine. The caller writes the manifest.
    """
    problems = preflight(cfg)
    exe = shutil.which("trtllm-build")
    if not problems and exe is None:
        problems.append(Problem("trtllm-build is not on PATH although tensorrt_llm imports",
                                "activate the environment TensorRT-LLM was installed into"))
    if problems:
        raise UnavailableError(
            f"cannot build TensorRT-LLM engines for {cfg.name} here:" + bullets(problems),
            fix=f"run `trtllm-pipeline build -c {cfg.file_arg} --dry-run` to see the plan, "
            "or use the torch runtime (`--runtime torch`)")
    engine_dir = Path(engine_dir)
    world = cfg.parallelism.world_size
    version, _ = trtllm_status()
    with artifacts.atomic_dir(engine_dir) as tmp:
        cmd = trtllm_build_command(cfg, checkpoint_dir, tmp)
        cmd[0] = exe
        failed_log = engine_dir.parent / FAILED_BUILD_LOG
        tail = _run_streaming(cmd, tmp / BUILD_LOG, failed_log)
        missing = engine_layout_problems(tmp, world)
        if missing:
            shutil.copyfile(tmp / BUILD_LOG, failed_log)
            raise StageFailed(
                f"trtllm-build exited 0 but its output is incomplete: {'; '.join(missing)}. "
                f"Last lines of its log ({failed_log}):\n{tail}",
                fix="re-run with build.extra_args: ['--log_level', 'verbose'] for more detail")
        engine_config = read_engine_config(tmp)
    published = trtllm_build_command(cfg, checkpoint_dir, engine_dir)
    return {
        "engine": {"kind": "TensorRT-LLM engine (trtllm-build)", "world_size": world,
                   "files": [f"rank{r}.engine" for r in range(world)], "tensorrt_llm": version,
                   "engine_version": engine_config.get("version"),
                   "plugin_config": engine_config["build_config"].get("plugin_config")},
        "trtllm_build": {"command": published, "log": BUILD_LOG},
    }


def _run_streaming(cmd: list[str], log_path: Path, failed_log: Path, tail_lines: int = 30) -> str:
    """Run ``cmd``, copying its output to the logger and ``log_path``; on a non-zero exit keep the log
    as ``failed_log`` and raise StageFailed with its last lines."""
    tail: collections.deque[str] = collections.deque(maxlen=tail_lines)
    with open(log_path, "w", encoding="utf-8") as sink:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
        assert proc.stdout is not None
        for line in proc.stdout:
            sink.write(line)
            tail.append(line.rstrip())
            log.info("trtllm-build: %s", line.rstrip())
        code = proc.wait()
    text = "\n".join(tail)
    if code != 0:
        shutil.copyfile(log_path, failed_log)
        raise StageFailed(f"trtllm-build exited with code {code}. Last lines of its log ({failed_log}):\n{text}",
                          fix="common causes: GPU out of memory (lower build.max_batch_size/max_seq_len, raise "
                          "tp), a checkpoint from another TensorRT-LLM version (re-run quantize --force)")
    return text
