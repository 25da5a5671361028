"""``maxjax.nn.comm``: MAX's communication helpers (``max.nn.comm``): :class:`Signals` and
:class:`Allreduce` (:mod:`maxjax.nn.comm.allreduce`), and the expert-parallel configuration
(:mod:`maxjax.nn.comm.ep`)."""

from maxjax.nn.comm.allreduce import Allreduce, MulticastPool, SignalBufferType, Signals

__all__ = ["Allreduce", "MulticastPool", "SignalBufferType", "Signals"]
