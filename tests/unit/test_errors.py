"""One error taxonomy (hetmm_ray/errors.py): every project error class reaches both surfaces.

Each class found under ``hetmm_ray`` is raised (1) inside a real ``hetmm`` command run through
``cli.main``: one line ``hetmm: error: <message>`` and exit status 2, never "unexpected"; and
(2) through the ingress's mapping to its HTTP answer: the table's status, its code and the
``{"error": {"code", "message"}}`` body. The HTTP side once answered 500 for
WeightsError and DatasetError, and the CLI called SourceError "unexpected".
"""

from __future__ import annotations

import importlib
import json
import os
import pkgutil
import subprocess
import sys

import pytest

import hetmm_ray
from hetmm_ray import cli
from hetmm_ray.cli import store_admin
from hetmm_ray.errors import ERRORS, HetmmError, all_error_classes


def _import_all() -> None:
    for info in pkgutil.walk_packages(hetmm_ray.__path__, "hetmm_ray."):
        importlib.import_module(info.name)


_import_all()
CLASSES = all_error_classes()
PER_INSTANCE = {"Refused": (403, "forbidden")}


def _instance(cls: type[HetmmError], message: str) -> HetmmError:
    if cls.__name__ in PER_INSTANCE:
        return cls(*PER_INSTANCE[cls.__name__], message)  # type: ignore[call-arg]
    if cls.__name__ == "ImageError":
        source, problem = message.split(": ", 1)
        return cls(source, problem)  # type: ignore[call-arg]
    return cls(message)


def _expected(cls: type[HetmmError]) -> tuple[int, str]:
    return PER_INSTANCE.get(cls.__name__, ERRORS[cls.__name__])


def test_the_table_knows_every_class_and_nothing_else() -> None:
    names = {c.__name__ for c in CLASSES}
    # the ten classes first counted, and the ones that were already HTTP/CLI-only
    assert {"ConfigError", "ImageError", "SourceError", "DatasetError", "WeightsError", "StoreError"} <= names
    assert {"ProductNotFound", "StoreConflict", "TemplateError", "ClusterUnavailable"} <= names
    assert names == set(ERRORS) - {"HetmmError"}, "ERRORS lists a class that no longer exists, or misses one"
    for cls in CLASSES:
        assert (cls.status, cls.code) == ERRORS[cls.__name__]


def test_an_unlisted_subclass_fails_at_definition() -> None:
    with pytest.raises(TypeError, match=r"add it to hetmm_ray\.errors\.ERRORS"):
        type("NewError", (HetmmError,), {"__module__": "hetmm_ray.somewhere"})


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_cli_prints_one_line_and_exits_2(
    cls: type[HetmmError], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path
) -> None:
    message = "image 3: the thing went wrong"

    def failing(_args: object) -> int:
        raise _instance(cls, message)

    monkeypatch.setattr(store_admin, "cmd_versions", failing)  # the parser binds the command when main builds it
    code = cli.main(["versions", "--store", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2
    assert err == f"hetmm: error: {message}\n", err


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_http_answers_the_tables_status_with_the_json_shape(cls: type[HetmmError]) -> None:
    from hetmm_ray.serve.answers import classify
    from hetmm_ray.serve.answers import error_response as _error

    message = "image 3: the thing went wrong"
    response = _error(classify(_instance(cls, message)))
    status, code = _expected(cls)
    assert response.status_code == status
    assert json.loads(response.body) == {"error": {"code": code, "message": message}}


def test_a_ray_task_error_is_answered_as_its_cause() -> None:
    """Ray re-raises a task's error as a subclass of its cause: both surfaces read the cause."""
    from ray.exceptions import RayTaskError

    from hetmm_ray.core.backbone import WeightsError
    from hetmm_ray.serve.answers import classify

    try:
        raise WeightsError("weights file /w.pth not found")
    except WeightsError as cause:
        wrapped = RayTaskError("extract", "Traceback ...\nWeightsError: weights file /w.pth not found", cause)
        remote = wrapped.as_instanceof_cause()
    assert isinstance(remote, WeightsError)
    err = classify(remote)
    assert (err.status, err.code, err.message) == (422, "bad_weights", "weights file /w.pth not found")
    assert cli.error_line(remote) == "weights file /w.pth not found"


def test_other_exceptions_stay_internal() -> None:
    from hetmm_ray.serve.answers import classify

    err = classify(ZeroDivisionError("x"))
    assert (err.status, err.code) == (500, "internal")
    assert cli.error_line(ZeroDivisionError("x")).startswith("unexpected ZeroDivisionError")


def test_a_failed_job_is_answered_through_the_table() -> None:
    """A create that loses the race for a product name fails its job with StoreConflict: the waiting
    request answers 409 ``conflict`` (the table's), not 422 ``job_failed`` (as it once did)."""
    import asyncio

    from hetmm_ray.distributed.jobs import JobBoard
    from hetmm_ray.serve.answers import job_answer
    from hetmm_ray.store import StoreConflict, StoreUnavailable

    async def failed(exc: BaseException) -> dict:
        board = JobBoard()

        async def work(_progress: object) -> int:
            raise exc

        record = board.start("create", "p", work)
        return await board.wait(record["id"], 10.0)

    cases = [
        (StoreConflict("product 'p' already exists; add images with .../normals"), 409, "conflict"),
        (StoreUnavailable("store at 127.0.0.1:1 unreachable"), 503, "store_unavailable"),
        (ZeroDivisionError("division by zero"), 500, "internal"),
    ]
    for exc, status, code in cases:
        record = asyncio.run(failed(exc))
        assert record["state"] == "failed" and record["error"]["type"] == type(exc).__name__
        response = job_answer(record)
        body = json.loads(response.body)
        assert response.status_code == status
        assert body["error"] == {"code": code, "message": str(exc)}
        assert body["job"]["id"] == record["id"]


def test_a_reader_that_goes_away_ends_the_command_quietly(tmp_path) -> None:
    """``hetmm versions | head``: when standard output's reader has gone, the command stops with
    status 141 (128 + SIGPIPE, as Unix tools) and says nothing on stderr (it said 'Broken pipe')."""
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first line is written
    try:
        argv = [sys.executable, "-m", "hetmm_ray.cli", "versions", "--store", str(tmp_path / "none")]
        done = subprocess.run(argv, stdout=write, stderr=subprocess.PIPE, timeout=120, check=False)
    finally:
        os.close(write)
    assert done.returncode == 141 and done.stderr == b"", done.stderr.decode()
    # with a reader, the same command prints and succeeds
    done = subprocess.run(argv, capture_output=True, timeout=120, check=False)
    assert done.returncode == 0 and b"no products in" in done.stdout, done
