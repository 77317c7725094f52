"""The Python-backend stub's own environment, where the serving Python has numpy 2.

The stub of the tritonserver bundled with nvidia-pytriton 0.7.0 (Triton 2.51) is built against
numpy 1: with numpy 2 it reads every tensor wrongly and crashes on text inputs (docs/serving.md).
It ignores PYTHONPATH and takes its interpreter's prefix from the first ``python3`` on PATH, so
``serve`` gives it a virtual environment made from the serving Python (``python -m venv
--without-pip``) that holds numpy<2 in its own site-packages, with a ``.pth`` that adds the serving
Python's site-packages after it: the stub imports numpy 1 and everything else (torch, tokenizers,
this package) from the serving Python. numpy 1.26 cannot import transformers on an image built for
numpy 2 (its scipy), so nothing that runs in the stub imports transformers.

One environment per serving Python and numpy requirement, made once under the cache directory and
reused by every build: under a temporary name, renamed when whole, ``stub-env.json`` written last.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import site
import subprocess
import sys
from pathlib import Path
from typing import Iterator

from trtllm_pipeline import artifacts
from trtllm_pipeline.errors import UnavailableError
from trtllm_pipeline.machine import package_version
from trtllm_pipeline.model.builtin import cache_root

NUMPY_REQUIREMENT = "numpy<2"  # what nvidia-pytriton 0.7.0 asks for; 1.26.4 on every Python up to 3.12
WHEELS_ENV = "TRTLLM_PIPELINE_STUB_WHEELS"  # a folder of wheels (numpy<2) for machines without an index
PTH_FILE = "zz_serving_python.pth"  # after every other .pth of the environment
RECORD = "stub-env.json"  # written last: what was made, and where its site-packages are
PIP_TIMEOUT_S = 600


@dataclasses.dataclass(frozen=True)
class StubEnv:
    path: Path
    numpy: str  # the numpy version the stub imports there
    site_packages: Path  # the environment's own, first on the stub's path

    @property
    def bin(self) -> Path:
        return self.path / "bin"


def needed() -> bool:
    """Whether the serving Python's numpy is one the bundled stub cannot use (2 or newer)."""
    return int((package_version("numpy") or "0").split(".")[0]) >= 2


def env_dir() -> Path:
    """This serving Python's stub environment: keyed by the interpreter (its path, prefix and version) and
    the numpy requirement, so each Python gets its own and every build of one Python shares it."""
    key = json.dumps([sys.executable, sys.prefix, sys.version, NUMPY_REQUIREMENT])
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    return cache_root() / "stub-envs" / f"py{version}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"


def wheels_dir(given: str | os.PathLike | None = None) -> Path | None:
    """The wheel folder: ``--stub-wheels``, else $TRTLLM_PIPELINE_STUB_WHEELS, else none (pip's index)."""
    chosen = given or os.environ.get(WHEELS_ENV)
    return Path(chosen).expanduser().resolve() if chosen else None


def ready() -> StubEnv | None:
    """The prepared environment, if there is one (its record is written last)."""
    path = env_dir()
    try:
        record = json.loads((path / RECORD).read_text(encoding="utf-8"))
        return StubEnv(path, record["numpy"], path / record["site_packages"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def describe(wheels: Path | None = None) -> str:
    """Which numpy the stub will import here, in words (``doctor``)."""
    serving = package_version("numpy")
    if not needed():
        return f"{serving} (the serving Python's)"
    env = ready()
    if env is None:
        source = f"the wheel folder {wheels}" if wheels else "pip's index"
        return (f"numpy<2 from the stub environment `serve` will prepare in {env_dir()} from {source} (the stub "
                f"cannot use the serving Python's numpy {serving})")
    try:
        return f"{imported_numpy(env.path)} from the stub environment {env.path} (the serving Python has {serving})"
    except UnavailableError as exc:
        return f"none: the stub environment {env.path} is broken ({exc.message.splitlines()[-1]}); delete it"


def ensure(wheels: Path | None = None) -> StubEnv:
    """The stub environment, prepared if it is not yet (a few seconds; pip's download the first time).

    Raises UnavailableError (exit 3) saying what was tried where it cannot be made."""
    final = env_dir()
    with _lock(final.with_name(final.name + ".lock")):  # two serves at once: one prepares, the other waits
        if (env := ready()) is not None:
            return env
        with artifacts.atomic_dir(final) as tmp:
            numpy, target = _prepare(tmp, wheels)
            artifacts.write_json_atomic(tmp / RECORD, {
                "serving_python": sys.executable, "python": sys.version.split()[0], "requirement": NUMPY_REQUIREMENT,
                "numpy": numpy, "site_packages": str(target.relative_to(tmp)),
                "wheels": str(wheels) if wheels else None, "created_at": artifacts.now_iso()})
    return ready()


def _prepare(prefix: Path, wheels: Path | None) -> tuple[str, Path]:
    """Make the environment at ``prefix``: (the numpy version it imports, its own site-packages)."""
    _run([sys.executable, "-m", "venv", "--without-pip", str(prefix)], "make the virtual environment", wheels)
    # Where the environment's interpreter looks (its scheme, not necessarily this one's: Debian's differ)
    where = _run([str(prefix / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                 "ask the environment for its site-packages", wheels, env=_clean_env())
    target = Path(where.strip().splitlines()[-1])
    target.mkdir(parents=True, exist_ok=True)
    source = (["--no-index", "--find-links", str(wheels)] if wheels else ["--retries", "2", "--timeout", "20"])
    # --target: numpy<2 goes into the environment's own site-packages whatever the serving Python has installed
    install = ["install", "--disable-pip-version-check", "--no-input", "--only-binary=:all:", "--target",
               str(target), *source, NUMPY_REQUIREMENT]
    # Its metadata, not find_spec("pip"): setuptools' distutils hook takes a look-up of pip as "pip is running"
    # and hands this process the standard library's distutils, which breaks torch's cpp_extension later.
    if package_version("pip") is not None:
        pip = [sys.executable, "-m", "pip"]
    else:  # a serving Python without pip (uv's environments): the environment's own, from ensurepip's wheel
        _run([str(prefix / "bin" / "python"), "-m", "ensurepip", "--default-pip"], "install pip (ensurepip)", wheels)
        pip = [str(prefix / "bin" / "python"), "-m", "pip"]
    _run([*pip, *install], f"pip {' '.join(install)}", wheels)
    # After the install, never before: a pip that saw the serving Python's numpy 2 might try to remove it.
    (target / PTH_FILE).write_text(pth_text(), encoding="utf-8")
    return imported_numpy(prefix, wheels), target


def pth_text() -> str:
    """Lines that add the serving Python's site-packages after the environment's own, processing their
    ``.pth`` files (editable installs), as the serving Python does."""
    dirs = [d for d in site.getsitepackages() if Path(d).is_dir()]
    if site.ENABLE_USER_SITE and Path(site.getusersitepackages()).is_dir():
        dirs.append(site.getusersitepackages())
    return "".join(f"import site; site.addsitedir({d!r})\n" for d in dirs)


def imported_numpy(prefix: Path, wheels: Path | None = None) -> str:
    """The numpy version the environment's interpreter imports, run as the stub runs it (no PYTHONPATH);
    it must be below 2 and come from the environment itself."""
    probe = "import numpy; print(numpy.__version__); print(numpy.__file__)"
    out = _run([str(prefix / "bin" / "python"), "-c", probe], "import numpy in the environment", wheels,
               env=_clean_env())
    version, where = out.strip().splitlines()[-2:]
    if int(version.split(".")[0]) >= 2 or not Path(where).resolve().is_relative_to(prefix.resolve()):
        raise _unavailable(f"the environment's interpreter imported numpy {version} from {where}", wheels)
    return version


def _clean_env() -> dict[str, str]:
    """This process's environment without PYTHONPATH and the like: the stub ignores them."""
    return {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}


def _run(cmd: list[str], what: str, wheels: Path | None, env: dict[str, str] | None = None) -> str:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=PIP_TIMEOUT_S, env=env)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise _unavailable(f"{what} failed: {exc}", wheels) from None
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-6:])
        raise _unavailable(f"{what} failed (exit {proc.returncode}):\n{tail}", wheels)
    return proc.stdout


def _unavailable(what: str, wheels: Path | None) -> UnavailableError:
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    where = f"from the wheel folder {wheels}" if wheels else "with pip from its index"
    return UnavailableError(
        f"numpy {package_version('numpy')} is installed where the server runs, and the Python-backend stub of the "
        "tritonserver in nvidia-pytriton 0.7.0 (Triton 2.51) needs numpy<2. Preparing a numpy<2 environment for "
        f"the stub in {env_dir()} {where}: {what}",
        fix=f"put a numpy<2 wheel for {tag} (numpy-1.26.4-{tag}-...manylinux...whl) in a folder and pass it "
            f"with --stub-wheels DIR or ${WHEELS_ENV}, or let pip reach PyPI, or pip install 'numpy<2' "
            "where the server runs")


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
