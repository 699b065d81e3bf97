"""The backbone's convolutions run by OpenVINO on a CPU: the same features, several times faster.

Semantics: ``OpenVinoTaps(extractor, taps, identity)(x)`` returns what ``extractor(x)`` returns
(``{tap: (B, C, h, w) float32}``, ``x`` a float32 (B, 3, H, W) batch already normalised),
computed by an OpenVINO model converted from the same network with inference precision f32.
Equal to the torch network within float32 rounding: relative differences ~1e-6 on
mobilenet_v2, ResNets and EfficientNet-Lite (tests/unit/core/test_fast_runtime.py bounds them at
1e-5 and checks that no verdict moves; docs/performance.md has the timings).

Why: on this project's AVX2 CPUs torch runs mobilenet-class backbones as a chain of small,
separate oneDNN primitives; OpenVINO fuses them (conv + activation + residual) and schedules
the graph as one, which is faster (docs/performance.md). No weights are rounded (f32 hint, so
CPUs with bf16 units do not switch precision behind our back) and thread pinning is off (Ray runs
several processes per host).

A conversion traces the network (seconds or more on a busy machine), so it is
done once per machine: the converted model is saved in OpenVINO's own format (an XML graph and
a raw weights file, never a pickle) under ``cache_dir`` (config.MODEL_CACHE_ENV, default
``~/.cache/hetmm/openvino``), named by a digest of the network's identity (backbone name,
weights identity, taps, BN folding), the input height and width (the batch dimension is
dynamic), and the source of the code that builds the network and the versions of torch and
OpenVINO, so a code or library change never reads a stale graph. A file is written to a
temporary name and renamed, so concurrent processes never read half a file; an unreadable
cache entry is converted again. Compiled models are kept per process (also keyed by the thread
count): every detector, replica or task in a process that uses the same backbone shares one.
Infer requests are not thread-safe, so each thread gets its own (held in a module dict, not in
thread-local storage: see ``_requests``).

At exit: every compiled model and infer request is released by an ``atexit`` hook, after the
inferences in flight have finished and every other thread that has inferred and is still alive
has come back for another inference and been *parked* there (blocked for good on a lock), both
bounded by ``EXIT_WAIT_S``. An inference asked for later by the main thread (another exit hook) is
refused with an error. Why, two causes of the same abort:

- the process's C++ static destructors tear OpenVINO's executor threads down while another
  thread still infers, and the process ends with "terminate called without an active exception"
  (SIGABRT) or a segfault (reproduced: a daemon thread inferring at exit aborted 3 runs of 3);
- a daemon thread still running torch code once the interpreter finalizes: CPython 3.11 ends a
  thread that asks for the GIL then with ``pthread_exit``, whose forced unwind through a C++
  ``noexcept`` frame calls ``std::terminate`` (gdb, 2 exits of 16 under load with the first fix
  alone: ``take_gil`` -> ``PyThread_exit_thread`` inside torch's ``THPVariable_clear``, a result
  tensor freed between two calls). A thread parked on a lock holds no C++ frame and never asks
  for the GIL again, so finalization cannot end it that way. The thread pools of this package are
  not daemons (``concurrent.futures`` joins them before exit hooks run); the park is for a
  caller's own daemon threads.
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import os
import sys
import threading
import time
import warnings
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from ..config import model_cache_dir
from .device import usable_cores

__all__ = ["OpenVinoTaps", "TapsAsTuple", "openvino_available"]

# Distinct (network, input size, threads) compiled at once in one process: a replica serving
# products of a few backbones and canvas sizes; each entry holds a copy of the weights.
COMPILED_MODELS_KEPT = 8


@functools.lru_cache(maxsize=1)
def openvino_available() -> bool:
    """True when the ``openvino`` package imports here (it is a dependency; a bare install
    without it falls back to torch)."""
    try:
        _openvino()
    except ImportError:
        return False
    return True


def _openvino() -> Any:
    """The ``openvino`` module, imported without OpenVINO's telemetry.

    ``import openvino`` imports its model converter (``openvino.tools.ovc``), which sends Google
    Analytics events (the import; each conversion's parameters and result) and writes a client id
    under ``~/intel`` unless an opt-out file exists there or ``CI=true``: a line PC would report to a
    third party without anyone asking. The converter falls back to its own no-op stub when
    ``openvino_telemetry`` cannot be imported, so that import is blocked in this process before
    OpenVINO is first imported (a ``None`` entry in ``sys.modules`` makes an import fail).
    """
    if "openvino" not in sys.modules:
        sys.modules.setdefault("openvino_telemetry", None)  # type: ignore[arg-type]
    import openvino

    return openvino


class TapsAsTuple(nn.Module):
    """The extractor with its dict output flattened in tap order (what a converter can trace)."""

    def __init__(self, extractor: nn.Module, taps: Sequence[str]) -> None:
        super().__init__()
        self.extractor = extractor
        self.taps = tuple(taps)

    def forward(self, x: Tensor) -> tuple[Tensor, ...]:
        out = self.extractor(x)
        return tuple(out[t] for t in self.taps)


_compiled: OrderedDict[Hashable, Any] = OrderedDict()
_compiled_lock = threading.Lock()
# (thread id, id(model)) -> (model, infer request). A module dict, never thread-local storage: a
# process forked with Python code to run before exec (subprocess with preexec_fn, as Ray starts its
# processes) deletes every other thread's locals in the child, and an OpenVINO object destroyed
# there waits forever for executor threads the child does not have (seen: ray.init hung).
_requests: dict[tuple[int, int], tuple[Any, Any]] = {}
_requests_lock = threading.Lock()

EXIT_WAIT_S = 10.0  # how long the exit hook waits for inferences in flight
_in_flight = 0  # inferences running now (under _idle)
_idle = threading.Condition()
_released = False  # set at exit: no more inferences
_users: set[int] = set()  # idents of the threads that have inferred (under _idle)
_parked: set[int] = set()  # idents of the threads parked at exit (under _idle)
_FOREIGN_THREAD: Any = getattr(threading, "_DummyThread", ())  # a thread Python did not start


class _Inference:
    """Counts an inference in flight; once the process is exiting, refuses the main thread's and
    parks any other thread's (see the module's docstring)."""

    def __enter__(self) -> None:
        global _in_flight
        ident = threading.get_ident()
        with _idle:
            if not _released:
                _in_flight += 1
                _users.add(ident)
                return
            if threading.current_thread() is threading.main_thread():
                raise RuntimeError("OpenVINO backbone: the process is exiting, its compiled models are released")
            _parked.add(ident)
            _idle.notify_all()
        threading.Event().wait()  # never set: this thread stays here until the process has ended

    def __exit__(self, *exc: object) -> None:
        global _in_flight
        with _idle:
            _in_flight -= 1
            _idle.notify_all()


@atexit.register
def release_compiled_models(wait_s: float = EXIT_WAIT_S) -> None:
    """Refuse new inferences, wait (bounded) for those in flight, and release every compiled model
    and infer request of this process while the interpreter and OpenVINO are whole."""
    global _released
    deadline = time.monotonic() + wait_s

    def others_parked() -> bool:  # every other live Python thread that has inferred waits in the park
        # Threads started outside Python (a Ray worker's task threads) show as dummies that never
        # end: they cannot be waited for, so only the threads Python started count.
        alive = {t.ident for t in threading.enumerate() if not isinstance(t, _FOREIGN_THREAD)}
        return (_users & (alive - {threading.get_ident()})) <= _parked

    with _idle:
        _released = True
        _idle.wait_for(lambda: _in_flight == 0, timeout=wait_s)
        _idle.wait_for(others_parked, timeout=max(0.0, deadline - time.monotonic()))
    with _requests_lock:
        _requests.clear()
    with _compiled_lock:
        _compiled.clear()


@functools.lru_cache(maxsize=1)
def _code_fingerprint() -> str:
    """Digest of what decides the converted graph besides the identity: the modules that build
    and fold the networks, and the torch and OpenVINO versions."""
    ov = _openvino()

    h = hashlib.sha256(f"{torch.__version__}|{ov.__version__}".encode())
    here = Path(__file__).resolve().parent
    for name in ("backbone.py", "efficientnet_lite.py", "fuse.py", "openvino_runtime.py"):
        h.update((here / name).read_bytes())
    return h.hexdigest()[:16]


def _converted(extractor: nn.Module, taps: Sequence[str], identity: Hashable, height: int, width: int) -> Any:
    """The OpenVINO model of ``extractor`` for (height, width) inputs, from the disk cache or
    converted now (and cached)."""
    ov = _openvino()

    key = repr((identity, tuple(taps), height, width, _code_fingerprint()))
    path = model_cache_dir() / "openvino" / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.xml"
    core = ov.Core()
    if path.is_file():
        try:
            return core.read_model(str(path))
        except Exception:  # noqa: BLE001 - a damaged cache entry is converted again
            pass
    # OpenVINO traces the network with torch.jit.trace, which torch now deprecates (a warning per
    # call, not an error): the traced graph is checked against torch by the tests.
    with torch.no_grad(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"torch\.jit")
        model = ov.convert_model(
            TapsAsTuple(extractor, taps).eval(),
            example_input=torch.zeros(1, 3, height, width),
            input=[ov.PartialShape([-1, 3, height, width])],
        )
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.stem}.{os.getpid()}.{threading.get_ident()}.tmp.xml")
        ov.save_model(model, str(tmp), compress_to_fp16=False)
        os.replace(tmp.with_suffix(".bin"), path.with_suffix(".bin"))
        os.replace(tmp, path)
    except OSError:  # a read-only home: convert every time, still correct
        pass
    return model


def _compile(
    extractor: nn.Module, taps: Sequence[str], identity: Hashable, height: int, width: int, threads: int
) -> Any:
    ov = _openvino()

    model = _converted(extractor, taps, identity, height, width)
    # One call uses the caller's torch thread count; enough streams that callers running at
    # once (hetmm_ray.detection.pipeline.map_in_workers: one thread each) fill the cores side by side.
    streams = max(1, usable_cores() // threads)
    return ov.Core().compile_model(
        model,
        "CPU",
        {
            "NUM_STREAMS": streams,
            "INFERENCE_NUM_THREADS": threads * streams,
            "INFERENCE_PRECISION_HINT": "f32",
            "ENABLE_CPU_PINNING": False,
        },
    )


class OpenVinoTaps:
    """``extractor`` (a float32 torch network returning ``{tap: tensor}``) run by OpenVINO.

    ``identity`` names the network's weights and structure: two extractors with the same
    identity must compute the same function (they share a compiled model).
    """

    def __init__(self, extractor: nn.Module, taps: Sequence[str], identity: Hashable) -> None:
        if not openvino_available():
            raise ImportError("the openvino package is not installed (pip install openvino)")
        self.extractor = extractor
        self.taps = tuple(taps)
        self.identity = identity

    def compiled(self, height: int, width: int) -> Any:
        """The compiled model for (height, width) inputs with this thread's torch thread count."""
        threads = max(1, torch.get_num_threads())
        key = (self.identity, self.taps, height, width, threads)
        with _compiled_lock:
            model = _compiled.get(key)
            if model is None:
                model = _compile(self.extractor, self.taps, self.identity, height, width, threads)
                _compiled[key] = model
                while len(_compiled) > COMPILED_MODELS_KEPT:
                    _compiled.popitem(last=False)
            _compiled.move_to_end(key)
        return model

    def __call__(self, x: Tensor) -> dict[str, Tensor]:
        if x.dtype != torch.float32 or x.device.type != "cpu":
            raise ValueError(f"OpenVINO backbone: expected a float32 CPU batch, got {x.dtype} on {x.device}")
        with _Inference():
            return self._infer(x)

    def _infer(self, x: Tensor) -> dict[str, Tensor]:
        model = self.compiled(int(x.shape[2]), int(x.shape[3]))
        key = (threading.get_ident(), id(model))
        with _requests_lock:
            request = _requests.get(key)
            if request is None or request[0] is not model:
                if len(_requests) >= 4 * COMPILED_MODELS_KEPT:  # let evicted models and dead threads' go
                    _requests.clear()
                request = _requests[key] = (model, model.create_infer_request())
                # Every thread passes here (under the lock) before its first infer, so the first one
                # initialises pybind11's numpy bridge alone. Why: ``infer`` calls ``Type.to_dtype``,
                # whose first call runs a C++ static initialiser that waits for the GIL; two scoring
                # threads reaching it at once deadlock (one holds the static's guard and waits for the
                # GIL, the other holds the GIL and waits for the guard): ``hetmm predict`` with 2 score
                # workers hung so (py-spy: __cxa_guard_acquire beside pybind11 gil_safe_call_once).
                request[0].inputs[0].get_element_type().to_dtype()
        # share_inputs: OpenVINO reads the batch in place; outputs are copied out of the
        # request's buffers, which the next call on this thread overwrites.
        result = request[1].infer({0: x.contiguous().numpy()}, share_inputs=True)
        return {tap: torch.from_numpy(result[i]) for i, tap in enumerate(self.taps)}
