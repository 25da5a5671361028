"""Devices (MAX's ``max.driver.driver`` and the device half of ``max._core.driver``), on JAX devices.

- :class:`Device` wraps one ``jax.Device``; :class:`CPU` and :class:`Accelerator` are its two kinds
  (``isinstance(d, Accelerator)`` means "not the host", as in MAX).
- :class:`DeviceSpec`, :func:`load_devices`, :func:`scan_available_devices`, :func:`devices_exist`:
  MAX's device specifications (MAX 26.7 ``max/driver/driver.py``).
- :class:`DeviceQueue` and :class:`DeviceEvent`: MAX's streams and events. JAX orders work by data
  dependencies and exposes no streams, so a queue is its device's work as a whole: waiting on a
  queue or an event waits for the arrays that live on the device.
- Virtual devices, launch traces, completion flags and symmetric pools are MAX runtime features
  with no JAX counterpart: their getters answer as MAX does with the feature off, and anything
  that would turn one on raises ``NotImplementedError`` naming itself.
"""

from __future__ import annotations

import contextlib
import enum
import os
import weakref
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import jax

__all__ = [
    "CPU", "Accelerator", "CompletionFlag", "Device", "DeviceEvent", "DeviceQueue", "DeviceSpec", "HostHazardError",
    "LaunchTraceEntry", "SymmetricPool", "accelerator_api", "accelerator_architecture_name", "accelerator_count",
    "begin_launch_trace", "calculate_virtual_device_count", "calculate_virtual_device_count_from_cli", "devices_exist",
    "enable_all_peer_access", "get_virtual_cpu_target", "get_virtual_device_api", "get_virtual_device_count",
    "get_virtual_device_target_arch", "is_virtual_device_mode", "jax_device_of", "launch_trace", "load_devices",
    "scan_available_devices", "set_virtual_cpu_target", "set_virtual_device_api", "set_virtual_device_count",
    "set_virtual_device_target_arch", "take_launch_trace",
]  # fmt: skip


def _platform_devices(platform: str) -> list[jax.Device]:
    try:
        return jax.devices(platform)
    except RuntimeError:
        return []


def _accelerators() -> list[jax.Device]:
    return [d for d in jax.devices() if d.platform != "cpu"]


def _host_memory() -> tuple[int, int]:
    """(total, available) bytes of host memory, from ``sysconf``."""
    page = os.sysconf("SC_PAGE_SIZE")
    return os.sysconf("SC_PHYS_PAGES") * page, os.sysconf("SC_AVPHYS_PAGES") * page


class Device:
    """One device JAX can place arrays on (MAX's ``max.driver.Device``).

    Not built directly in MAX: use :class:`CPU` or :class:`Accelerator`. ``Device(jax_device)``
    (a maxjax extension) wraps a ``jax.Device`` as the :class:`CPU` or :class:`Accelerator` it is.

    Attributes:
        jax_device: the ``jax.Device``.

    Raises:
        TypeError: ``Device(x)`` with ``x`` not a ``jax.Device``.
    """

    __slots__ = ("jax_device",)

    def __new__(cls, jax_device: jax.Device) -> "Device":
        if not isinstance(jax_device, jax.Device):
            raise TypeError(f"Device(...) wraps a jax.Device, got {jax_device!r}: use CPU() or Accelerator() instead")
        return (CPU if jax_device.platform == "cpu" else Accelerator)._wrap(jax_device)

    @classmethod
    def _wrap(cls, jax_device: jax.Device) -> "Device":
        obj = object.__new__(cls)
        obj.jax_device = jax_device
        return obj

    def __reduce__(self) -> Any:
        return (Device, (self.jax_device,))

    def __copy__(self) -> "Device":
        return self

    def __deepcopy__(self, memo: Any) -> "Device":
        return self

    @staticmethod
    def cpu(id: int = 0) -> "CPU":
        """A CPU device (as :class:`CPU`)."""
        return CPU(id)

    # -- identity ----------------------------------------------------------------------------
    @property
    def label(self) -> str:
        """``"cpu"`` for the host, ``"gpu"`` for GPUs (``"tpu"`` for TPUs, which MAX does not have)."""
        return _label(self.jax_device.platform)

    @property
    def id(self) -> int:
        """The index of the device among JAX's devices of its platform (0 for the host CPU)."""
        return _platform_devices(self.jax_device.platform).index(self.jax_device)

    @property
    def api(self) -> str:
        """``"cpu"``, ``"cuda"`` (NVIDIA), ``"hip"`` (AMD ROCm) or ``"tpu"``."""
        if self.label == "gpu":
            version = str(getattr(self.jax_device.client, "platform_version", "")).lower()
            return "hip" if "rocm" in version or self.jax_device.platform == "rocm" else "cuda"
        return self.label

    @property
    def is_host(self) -> bool:
        """Whether this is the host CPU."""
        return self.label == "cpu"

    @property
    def is_host_unified(self) -> bool:
        """Whether this device and the host share one physical memory pool (True for the CPU)."""
        return self.is_host

    @property
    def is_compatible(self) -> bool:
        """Whether maxjax can run on this device (always True: JAX created it)."""
        return True

    @property
    def architecture_name(self) -> str:
        """The GPU architecture (``"sm_90"`` for an H100, the ``gfx`` name on ROCm; the device kind on TPU).

        Raises:
            ValueError: on the CPU (as in MAX).
        """
        if self.is_host:
            raise ValueError("failed to get device architecture name: Not implemented for device: cpu")
        cc = getattr(self.jax_device, "compute_capability", None)
        if cc:
            return f"sm_{str(cc).replace('.', '')}" if self.api == "cuda" else str(cc)
        return str(self.jax_device.device_kind)

    @property
    def model_name(self) -> str:
        """``"cpu"`` for the host, else JAX's device kind (such as ``"NVIDIA H100 80GB HBM3"``)."""
        return "cpu" if self.is_host else str(self.jax_device.device_kind)

    # -- memory ------------------------------------------------------------------------------
    @property
    def stats(self) -> Mapping[str, Any]:
        """``{"free_memory", "total_memory", "graph_mem_reserved", "graph_mem_used"}`` in bytes.

        Host memory from ``sysconf`` on the CPU; XLA's allocator (``bytes_limit``,
        ``bytes_in_use``) on an accelerator. maxjax reserves no graph memory (both 0).
        """
        if self.is_host:
            total, free = _host_memory()
        else:
            ms = self.jax_device.memory_stats() or {}
            total = int(ms.get("bytes_limit", 0))
            free = total - int(ms.get("bytes_in_use", 0))
        return {"free_memory": free, "total_memory": total, "graph_mem_reserved": 0, "graph_mem_used": 0}

    @property
    def max_single_alloc_size(self) -> int:
        """The largest single allocation in bytes (the device's total memory)."""
        return int(self.stats["total_memory"])

    def can_access(self, other: "Device") -> bool:
        """Whether this device reads ``other``'s memory directly: two accelerators of one platform
        (XLA copies between them device to device); never the host (as in MAX)."""
        return (not self.is_host and not other.is_host and self != other
                and self.jax_device.platform == other.jax_device.platform)  # fmt: skip

    # -- execution ---------------------------------------------------------------------------
    @property
    def default_queue(self) -> "DeviceQueue":
        """The device's queue (JAX has one ordered stream of work per device as far as users see)."""
        return DeviceQueue(self)

    def synchronize(self) -> None:
        """Waits until every array computed on this device is ready.

        Raises:
            Whatever error the pending computation raised.
        """
        jax.block_until_ready(_live_arrays_on(self.jax_device))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Device) and other.jax_device == self.jax_device

    def __hash__(self) -> int:
        return hash(self.jax_device)

    def __repr__(self) -> str:
        return f"Device(type={self.label},id={self.id})"


def _label(platform: str) -> str:
    return {"cuda": "gpu", "rocm": "gpu"}.get(platform, platform)


def _live_arrays_on(jax_device: jax.Device) -> list[jax.Array]:
    return [a for a in jax.live_arrays() if jax_device in a.devices()]


class CPU(Device):
    """The host CPU (MAX's ``max.driver.CPU``).

    Args:
        id: which CPU device (JAX has several with ``--xla_force_host_platform_device_count``);
            ``-1`` (what ``DeviceSpec.cpu()`` holds) means the first.

    Raises:
        ValueError: there is no CPU device with that id (MAX has one CPU and ignores ``id``).
    """

    __slots__ = ()

    def __new__(cls, id: int = 0) -> "CPU":
        devs = _platform_devices("cpu")
        index = 0 if id == -1 else id
        if not 0 <= index < len(devs):
            raise ValueError(f"failed to create device: no CPU device with id {id} ({len(devs)} CPU devices)")
        return cls._wrap(devs[index])


class Accelerator(Device):
    """A GPU or TPU (MAX's ``max.driver.Accelerator``); ``id=-1`` (the default) picks the first.

    Raises:
        ValueError: no accelerator is available, or none with that id.
    """

    __slots__ = ()

    def __new__(cls, id: int = -1) -> "Accelerator":
        devs = _accelerators()
        if not devs:
            raise ValueError(
                'failed to create device: No supported "gpu" device available '
                f"(JAX sees only {sorted({d.platform for d in jax.devices()})})"
            )
        index = 0 if id == -1 else id
        if not 0 <= index < len(devs):
            raise ValueError(f"failed to create device: no accelerator with id {id} ({len(devs)} accelerators)")
        return cls._wrap(devs[index])


def _unsafe_enqueue_py_host_func(self: Device, fn: Any) -> None:
    """MAX's ``Device.__unsafe_enqueue_py_host_func(fn)``: runs ``fn()`` on the host once the work
    already enqueued on this accelerator is done (maxjax waits for that work, then calls ``fn``).

    Raises:
        RuntimeError: on a CPU (MAX's CPU devices take no host callbacks).
    """
    if self.is_host:
        raise RuntimeError(f"__unsafe_enqueue_py_host_func: host callbacks are not supported on {self.label} devices")
    self.synchronize()
    fn()


# set after the class body: a name starting with "__" would be mangled there; MAX's is not
setattr(Device, "__unsafe_enqueue_py_host_func", _unsafe_enqueue_py_host_func)


def accelerator_count() -> int:
    """The number of GPU/TPU devices JAX sees (0 on a CPU-only machine)."""
    return len(_accelerators())


def accelerator_api() -> str:
    """The API of the first accelerator (``"cuda"``, ``"hip"``, ``"tpu"``), or ``"cpu"`` without one."""
    return (Accelerator() if accelerator_count() > 0 else CPU()).api


def accelerator_architecture_name() -> str:
    """The architecture name of the first accelerator.

    Raises:
        ValueError: there is no accelerator (the CPU has no architecture name, as in MAX).
    """
    return (Accelerator() if accelerator_count() > 0 else CPU()).architecture_name


def jax_device_of(device: Any) -> jax.Device:
    """The ``jax.Device`` of a :class:`Device`, a ``jax.Device``, a ``DeviceRef`` or a :class:`DeviceSpec`.

    Raises:
        TypeError: anything else.
    """
    if isinstance(device, Device):
        return device.jax_device
    if isinstance(device, jax.Device):
        return device
    if isinstance(device, DeviceSpec):
        return load_devices([device])[0].jax_device
    to_device = getattr(device, "to_device", None)  # a DeviceRef
    if callable(to_device):
        return to_device().jax_device
    raise TypeError(f"expected a Device or DeviceRef, got {device!r}")


# -- device specifications (MAX 26.7 max/driver/driver.py) --------------------------------------
@dataclass(frozen=True)
class DeviceSpec:
    """A device id and type (MAX's ``DeviceSpec``); :func:`load_devices` makes it a :class:`Device`.

    Raises:
        ValueError: a ``"gpu"`` spec with a negative id.
    """

    id: int
    device_type: Literal["cpu", "gpu"] = "cpu"

    def __post_init__(self) -> None:
        if self.device_type == "gpu" and self.id < 0:
            raise ValueError(f"id provided {self.id} for accelerator must always be greater than 0")

    @staticmethod
    def cpu(id: int = -1) -> "DeviceSpec":
        """A CPU spec (id -1: the host CPU)."""
        return DeviceSpec(id, "cpu")

    @staticmethod
    def accelerator(id: int = 0) -> "DeviceSpec":
        """An accelerator spec."""
        return DeviceSpec(id, "gpu")


def _load_device(spec: Any) -> Device:
    if isinstance(spec, Device):  # maxjax extension: a Device stands for itself
        return spec
    if not isinstance(spec, DeviceSpec):  # maxjax extension: a DeviceRef
        return Device(jax_device_of(spec))
    if spec.device_type == "cpu":
        return CPU(spec.id)
    available = accelerator_count()
    if spec.id >= available:
        reason = "no devices were found." if available == 0 else f"only found {available} devices."
        raise ValueError(f"Device {spec.id} was requested but {reason}")
    return Accelerator(spec.id)


def load_devices(device_specs: Sequence[DeviceSpec]) -> list[Device]:
    """The :class:`Device` of each :class:`DeviceSpec` (a ``Device`` or ``DeviceRef`` is accepted too).

    Raises:
        ValueError: an accelerator id that does not exist (MAX's message).
    """
    return [_load_device(s) for s in device_specs]


def scan_available_devices() -> list[DeviceSpec]:
    """Every accelerator's spec, or ``[DeviceSpec.cpu()]`` when there is none."""
    n = accelerator_count()
    return [DeviceSpec.accelerator(i) for i in range(n)] if n else [DeviceSpec.cpu()]


def devices_exist(devices: list[DeviceSpec]) -> bool:
    """Whether every accelerator spec names an existing accelerator (CPU specs always exist)."""
    available = scan_available_devices()
    return all(d.device_type == "cpu" or d in available for d in devices)


def calculate_virtual_device_count(*device_spec_lists: list[DeviceSpec]) -> int:
    """The highest GPU id in the specs plus one, at least 1."""
    ids = [s.id for specs in device_spec_lists for s in specs if s.device_type == "gpu"]
    return max(1, max(ids, default=-1) + 1)


def calculate_virtual_device_count_from_cli(*device_inputs: str | list[int]) -> int:
    """The highest GPU id in raw CLI device inputs (``"gpu"``, ``"gpu:0,2"``, ``"gpu:all"``, ``[0, 1]``)
    plus one, at least 1."""
    top = -1
    for item in device_inputs:
        if isinstance(item, list):
            top = max([top, *item])
        elif item == "gpu":
            top = max(top, 0)
        elif isinstance(item, str) and item.lower() == "gpu:all":
            top = max(top, accelerator_count() - 1)
        elif isinstance(item, str) and item.lower().startswith("gpu:"):
            for part in item.split(":", 1)[1].split(","):
                part = part.strip()
                if part and part.lower() != "all":
                    top = max(top, int(part))
    return max(1, top + 1)


# -- queues and events ------------------------------------------------------------------------
class DeviceQueue:
    """A queue of work on a device (MAX's ``DeviceQueue``).

    JAX exposes no streams: every queue of a device stands for all the device's work, ordered by
    data dependencies, so :meth:`synchronize` and :meth:`wait_for` wait for the device's arrays.
    """

    __slots__ = ("_device",)

    def __init__(self, device: Device):
        if not isinstance(device, Device):
            raise TypeError(f"DeviceQueue(device) takes a Device, got {device!r}")
        self._device = device

    @property
    def device(self) -> Device:
        """The device this queue runs on."""
        return self._device

    def synchronize(self) -> None:
        """Waits until the device's work is done (see :meth:`Device.synchronize`)."""
        self._device.synchronize()

    def record_event(self, event: "DeviceEvent | None" = None) -> "DeviceEvent | None":
        """Records ``event`` (or a new one, returned) at this point of the queue."""
        if event is None:
            event = DeviceEvent(self._device)
            event._record()
            return event
        event._record()
        return None

    def wait_for(self, other: "DeviceQueue | Device") -> None:
        """Orders later work after ``other``'s work so far. XLA orders work by data, so this waits
        on the host until ``other``'s work is done (a stronger guarantee than MAX's)."""
        (other if isinstance(other, Device) else other.device).synchronize()

    def wait_for_host_value(self, flag: Any, value: int) -> None:
        """Raises NotImplementedError: see :class:`CompletionFlag`."""
        raise NotImplementedError(
            "DeviceQueue.wait_for_host_value: XLA has no stream wait on host memory (no CompletionFlag in maxjax)"
        )

    @property
    def native_stream_handle(self) -> int:
        """0 on the CPU (no native stream, as in MAX).

        Raises:
            NotImplementedError: on an accelerator (JAX does not expose its CUDA streams).
        """
        if self._device.is_host:
            return 0
        raise NotImplementedError("DeviceQueue.native_stream_handle: JAX does not expose XLA's native GPU streams")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DeviceQueue) and other._device == self._device

    def __hash__(self) -> int:
        return hash(self._device)

    def __repr__(self) -> str:
        return f"{self._device.label}[{self._device.id}]"


class DeviceEvent:
    """A point in a device's work (MAX's ``DeviceEvent``): the arrays of the device when it was
    recorded. :meth:`is_ready` / :meth:`synchronize` ask and wait for those arrays.

    Args:
        device: the device.
        enable_timing: must be False (JAX exposes no device timestamps; use ``jax.profiler``).

    Raises:
        NotImplementedError: ``enable_timing=True``.
    """

    def __init__(self, device: Device, enable_timing: bool = False):
        if enable_timing:
            raise NotImplementedError(
                "DeviceEvent(enable_timing=True): JAX exposes no device timestamps; time work with jax.profiler"
            )
        self._device = device
        self._pending: list[weakref.ref] = []

    def _record(self) -> None:
        self._pending = [weakref.ref(a) for a in _live_arrays_on(self._device.jax_device)]

    def _arrays(self) -> list[jax.Array]:
        return [a for a in (r() for r in self._pending) if a is not None and not a.is_deleted()]

    def is_ready(self) -> bool:
        """Whether the work recorded before this event is done."""
        return all(a.is_ready() for a in self._arrays())

    def synchronize(self) -> None:
        """Waits until the work recorded before this event is done."""
        jax.block_until_ready(self._arrays())

    def elapsed_time(self, end_event: "DeviceEvent") -> float:
        """Raises NotImplementedError (events cannot have timing on JAX: see the class)."""
        raise NotImplementedError("DeviceEvent.elapsed_time: JAX exposes no device timestamps; use jax.profiler")

    def __repr__(self) -> str:
        return f"{self._device.label}[{self._device.id}]:event@{id(self):#x}"


class CompletionFlag:
    """MAX's host/device completion flag. Not available: XLA has no host-value wait on its streams.

    Raises:
        NotImplementedError: always (MAX raises RuntimeError on every device but CUDA).
    """

    def __init__(self, device: Device):
        raise NotImplementedError(
            "CompletionFlag: XLA streams cannot wait on a host memory value; order work through data dependencies"
        )


class HostHazardError(RuntimeError):
    """Raised when host code waits on a completion whose producer failed (MAX's; maxjax raises the
    producer's own error from ``block_until_ready`` instead, so it never raises this)."""


class LaunchTraceEntry:
    """One recorded device operation (MAX's; maxjax records none: see :func:`begin_launch_trace`)."""

    class OperationKind(enum.Enum):
        KERNEL_LAUNCH = 0
        MEMCPY = 1
        MEMSET = 2

    class MemcpyKind(enum.Enum):
        NONE = 0
        HTOD = 1
        DTOH = 2
        DTOD = 3

    def __init__(self, *args: Any, **kwargs: Any):
        raise TypeError("maxjax.driver.LaunchTraceEntry: no constructor defined!")


def begin_launch_trace() -> None:
    """Starts a launch trace. MAX records only on CUDA/HIP; on the host its trace stays empty,
    and so does maxjax's.

    Raises:
        NotImplementedError: an accelerator is present (XLA's launches are not recorded; use
            ``jax.profiler``).
    """
    if accelerator_count():
        raise NotImplementedError("begin_launch_trace: XLA's kernel launches are not recorded; use jax.profiler")


def take_launch_trace() -> list[LaunchTraceEntry]:
    """Stops the launch trace and returns its entries (none: see :func:`begin_launch_trace`)."""
    return []


@contextlib.contextmanager
def launch_trace() -> Iterator[list[LaunchTraceEntry]]:
    """The operations enqueued within the ``with`` block (see :func:`begin_launch_trace`)."""
    entries: list[LaunchTraceEntry] = []
    begin_launch_trace()
    try:
        yield entries
    finally:
        entries.extend(take_launch_trace())


class SymmetricPool:
    """MAX's multicast memory pool across devices: not available (XLA allocates collectives' memory)."""

    def __init__(self, *args: Any, **kwargs: Any):
        raise TypeError("maxjax.driver.SymmetricPool: no constructor defined!")

    @staticmethod
    def is_supported(devices: Sequence[Device]) -> bool:
        """False: maxjax has no multicast pools."""
        return False

    @staticmethod
    def lookup(devices: Sequence[Device]) -> None:
        """None: no pool is ever registered."""
        return None

    @staticmethod
    def allocate(devices: Sequence[Device], byte_size: int) -> "SymmetricPool":
        """Raises NotImplementedError: XLA allocates the memory of its collectives itself."""
        raise NotImplementedError("SymmetricPool.allocate: XLA allocates the memory of its collectives itself")


def enable_all_peer_access() -> None:
    """Nothing to do: XLA enables peer access between the GPUs a computation uses itself."""


# -- virtual devices: the getters answer as MAX does with virtual devices off -------------------
def _no_virtual(name: str) -> NotImplementedError:
    return NotImplementedError(
        f"{name}: maxjax has no virtual (compile-only) devices; XLA compiles for the devices JAX sees "
        "(ahead-of-time compilation for other targets: jax.jit(...).lower(...).compile())"
    )


def get_virtual_device_count() -> int:
    """0: virtual device mode is never on."""
    return 0


def is_virtual_device_mode() -> bool:
    """False: virtual device mode is never on."""
    return False


def get_virtual_device_api() -> str:
    """``""``: no virtual device API is set."""
    return ""


def get_virtual_device_target_arch() -> str:
    """``""``: no virtual target architecture is set."""
    return ""


def get_virtual_cpu_target() -> str:
    """``""``: kernels are compiled for the host CPU."""
    return ""


def set_virtual_device_count(count: int) -> None:
    """``0`` (off) is accepted; any other count raises NotImplementedError."""
    if count != 0:
        raise _no_virtual(f"set_virtual_device_count({count})")


def set_virtual_device_api(api: str) -> None:
    """Raises NotImplementedError (no virtual devices)."""
    raise _no_virtual(f"set_virtual_device_api({api!r})")


def set_virtual_device_target_arch(arch: str) -> None:
    """Raises NotImplementedError (no virtual devices)."""
    raise _no_virtual(f"set_virtual_device_target_arch({arch!r})")


def set_virtual_cpu_target(cpu: str) -> None:
    """``""`` (host-CPU codegen, what XLA does) is accepted; any other target raises NotImplementedError."""
    if cpu != "":
        raise _no_virtual(f"set_virtual_cpu_target({cpu!r})")
