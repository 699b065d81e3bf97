"""Local directory backend: objects are files, conditional writes use links and a lock.

Create-only writes land through ``os.link`` from a fully written temporary file
(atomic, fails if the name exists). Compare-and-swap takes an exclusive
``flock`` on a per-key lock file, compares the current ETag (sha256 of the
contents) and replaces the file with ``os.replace``. Both are safe across
processes on one machine; readers never see partial files.
"""

from __future__ import annotations

import builtins
import contextlib
import fcntl
import hashlib
import os
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

from .base import StoreConflict, StoreError

__all__ = ["STALE_TEMP_S", "LocalBackend"]

STALE_TEMP_S = 600.0
"""A temporary file untouched this long was left by a killed writer (a live one keeps writing it)."""


def _etag(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class LocalBackend:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        if self.root.exists() and not self.root.is_dir():
            raise StoreError(f"store {self.root} is not a directory")

    def describe(self) -> str:
        return str(self.root)

    def _path(self, key: str) -> Path:
        if key.startswith("/") or ".." in key.split("/"):
            raise StoreError(f"invalid store key {key!r}")
        return self.root / key

    def _temp(self, path: Path) -> tuple[int, str]:
        path.parent.mkdir(parents=True, exist_ok=True)
        return tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")

    def read(self, key: str) -> tuple[bytes, str]:
        try:
            data = self._path(key).read_bytes()
        except FileNotFoundError:
            raise KeyError(key) from None
        except OSError as exc:
            raise StoreError(f"{self._path(key)}: cannot read ({exc.strerror})") from None
        return data, _etag(data)

    def read_into(self, key: str, buffer: memoryview) -> None:
        try:
            with self._path(key).open("rb") as f:
                n = f.readinto(buffer)
        except FileNotFoundError:
            raise KeyError(key) from None
        if n != len(buffer):
            raise StoreError(f"{self._path(key)}: expected {len(buffer)} bytes, found {n}")

    def _land(self, tmp: str, path: Path, *, exclusive: bool) -> None:
        try:
            if exclusive:
                os.link(tmp, path)  # atomic create-only
            else:
                os.replace(tmp, path)
                return
        except FileExistsError:
            raise StoreConflict(f"{path} already exists (another writer)") from None
        finally:
            if exclusive:
                Path(tmp).unlink(missing_ok=True)

    def write(self, key: str, data: bytes, *, if_none_match: bool = False, if_match: str | None = None) -> str:
        path = self._path(key)
        fd, tmp = self._temp(path)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            if if_match is None:
                self._land(tmp, path, exclusive=if_none_match)
            else:
                with self._locked(path):
                    try:
                        current = _etag(path.read_bytes())
                    except FileNotFoundError:
                        current = None
                    if current != if_match:
                        raise StoreConflict(f"{path} changed since it was read (another writer)")
                    os.replace(tmp, path)
        finally:
            Path(tmp).unlink(missing_ok=True)
        return _etag(data)

    @contextlib.contextmanager
    def _locked(self, path: Path) -> Iterator[None]:
        lock = path.with_name(f".{path.name}.lock")
        with lock.open("a") as f:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f.fileno(), fcntl.LOCK_UN)

    def upload(self, key: str, stream: BinaryIO, size: int) -> None:
        path = self._path(key)
        fd, tmp = self._temp(path)
        try:
            with os.fdopen(fd, "wb") as f:
                shutil.copyfileobj(stream, f, length=8 << 20)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        finally:
            Path(tmp).unlink(missing_ok=True)

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def list(self, prefix: str) -> Iterator[str]:
        base = self._path(prefix.rstrip("/")) if prefix else self.root
        if not base.is_dir():
            return
        for p in sorted(base.rglob("*")):
            if p.is_file() and not p.name.startswith("."):
                yield p.relative_to(self.root).as_posix()

    def sweep_temp(self, prefix: str = "", *, older_than_s: float = STALE_TEMP_S) -> builtins.list[str]:
        """Remove temporary files (``.NAME.XXXX.tmp``) that a killed writer left; returns their keys.

        Only files not modified for ``older_than_s`` are removed, so a write in progress in
        another process keeps its file.
        """
        base = self._path(prefix.rstrip("/")) if prefix else self.root
        if not base.is_dir():
            return []
        cutoff = time.time() - older_than_s
        removed = []
        for p in sorted(base.rglob(".*.tmp")):
            try:
                if p.is_file() and p.stat().st_mtime < cutoff:
                    p.unlink()
                    removed.append(p.relative_to(self.root).as_posix())
            except FileNotFoundError:  # another sweeper took it
                continue
        return removed

    def delete(self, keys: Sequence[str]) -> None:
        for key in keys:
            self._path(key).unlink(missing_ok=True)
