"""``maxjax.driver``: devices and buffers (MAX's ``max.driver``), backed by JAX devices and arrays.

- :mod:`maxjax.driver.driver`: :class:`Device` (wrapping a ``jax.Device``), :class:`CPU`,
  :class:`Accelerator`, :class:`DeviceSpec`, queues and events, and MAX's runtime switches
  (virtual devices, launch traces), which answer as MAX does with them off or refuse by name.
- :mod:`maxjax.driver.buffer`: :class:`Buffer` (host NumPy memory, or one ``jax.Array``; see that
  module for what is shared and what is copied), :class:`Usage`, and :func:`to_jax_array` /
  :func:`to_host_array`, the one conversion of any array-like maxjax accepts.

Every public name of MAX 26.7's ``max.driver`` is here.
"""

from maxjax import __version__  # noqa: F401 - MAX's max.driver.__version__
from maxjax.driver.buffer import (
    Buffer,
    DLPackArray,
    Usage,
    batch_inplace_copy,
    copy_pinned_to_destinations,
    load_max_buffer,
    to_host_array,
    to_jax_array,
)
from maxjax.driver.driver import (
    CPU,
    Accelerator,
    CompletionFlag,
    Device,
    DeviceEvent,
    DeviceQueue,
    DeviceSpec,
    HostHazardError,
    LaunchTraceEntry,
    SymmetricPool,
    accelerator_api,
    accelerator_architecture_name,
    accelerator_count,
    begin_launch_trace,
    calculate_virtual_device_count,
    calculate_virtual_device_count_from_cli,
    devices_exist,
    enable_all_peer_access,
    get_virtual_cpu_target,
    get_virtual_device_api,
    get_virtual_device_count,
    get_virtual_device_target_arch,
    is_virtual_device_mode,
    jax_device_of,
    launch_trace,
    load_devices,
    scan_available_devices,
    set_virtual_cpu_target,
    set_virtual_device_api,
    set_virtual_device_count,
    set_virtual_device_target_arch,
    take_launch_trace,
)

__all__ = [
    "CPU", "Accelerator", "Buffer", "CompletionFlag", "DLPackArray", "Device", "DeviceEvent", "DeviceQueue",
    "DeviceSpec", "HostHazardError", "LaunchTraceEntry", "SymmetricPool", "Usage", "accelerator_api",
    "accelerator_architecture_name", "accelerator_count", "batch_inplace_copy", "begin_launch_trace",
    "calculate_virtual_device_count", "calculate_virtual_device_count_from_cli", "copy_pinned_to_destinations",
    "devices_exist", "enable_all_peer_access", "get_virtual_cpu_target", "get_virtual_device_api",
    "get_virtual_device_count", "get_virtual_device_target_arch", "is_virtual_device_mode", "launch_trace",
    "load_devices", "load_max_buffer", "scan_available_devices", "set_virtual_cpu_target", "set_virtual_device_api",
    "set_virtual_device_count", "set_virtual_device_target_arch", "take_launch_trace",
    # maxjax helpers
    "jax_device_of", "to_host_array", "to_jax_array",
]  # fmt: skip
