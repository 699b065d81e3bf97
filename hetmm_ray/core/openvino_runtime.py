"""The backbone's convolutions run by OpenVINO on a CPU: the same features, several times faster.

Semantics: ``OpenVinoTaps(extractor, taps, identity)(x)`` returns what ``extractor(x)`` returns
(``{tap: (B, C, h, w) float32}``, ``x`` a float32 (B, 3, H, W) batch already normalised),
computed by an OpenVINO model converted from the same network with inference precision f32.
Equal to the torch network within float32 rounding: relative differences ~1e-6 on
mobilenet_v2, ResNets and EfficientNet-Lite (tests/unit/core/test_fast_runtime.py bounds them at
1e-5 and checks that no verdict moves; BENCHMARKS.md "Throughput" has the timings).

Why: on this project's AVX2 CPUs torch runs mobilenet-class backbones as a chain of small,
separate oneDNN primitives; OpenVINO fuses them (conv + activation + residual) and schedules
the graph as one, measured 4-6x faster for mobilenet_v2 and efficientnet_lite0 at 256 px,
batch 8, 2 threads. No weights are rounded (f32 hint, so CPUs with bf16 units do not switch
precision behind our back) and thread pinning is off (Ray runs several processes per host).

A conversion traces the network (seconds to tens of seconds on a busy 2-core box), so it is
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
inferences in flight have finished (bounded by ``EXIT_WAIT_S``), and any inference asked for later
(a daemon thread still scoring) is refused with an error. Why: otherwise the process's C++ static
destructors tear OpenVINO's executor threads down while another thread still infers, and the
process ends with "terminate called without an active exception" (SIGABRT) or a segfault instead
of its exit status (reproduced: a daemon thread inferring at exit aborted 3 runs of 3, and none
of 8 with the hook; issue 41).
"""

from __future__ import annotations

import atexit
import functools
import hashlib
import os
import sys
import threading
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


class _Inference:
    """Counts an inference in flight, refused once the process is exiting (see the module's docstring)."""

    def __enter__(self) -> None:
        global _in_flight
        with _idle:
            if _released:
                raise RuntimeError("OpenVINO backbone: the process is exiting, its compiled models are released")
            _in_flight += 1

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
    with _idle:
        _released = True
        _idle.wait_for(lambda: _in_flight == 0, timeout=wait_s)
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
    # once (hetmm_ray.pipeline.map_in_workers: one thread each) fill the cores side by side.
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
