"""cushim's sleep mode from Python: pause and resume tagged device memory of this process.

The process must run under the shim (``cushim run`` or ``LD_PRELOAD=libcushim.so``) with
``sleep_mode:True`` in ``CUSHIM_ALLOC_CONF``; the functions are ctypes calls into the
preloaded library (see docs/SLEEP-MODE.md)::

    import cushim
    with cushim.region("kv_cache"):
        cache = torch.empty(...)        # tagged "kv_cache"
    cushim.pause("kv_cache")            # device memory given back, addresses kept
    cushim.resume("kv_cache")           # mapped again (contents discarded)
    cushim.pause("weights", backup=True)  # contents kept in host memory
"""

import contextlib
import ctypes

__all__ = [
    "CushimError",
    "available",
    "pause",
    "resume",
    "paused_bytes",
    "tag_push",
    "tag_pop",
    "region",
]

_NAMES = {
    1: "invalid value",
    2: "out of memory (the tag stays paused; resume it later)",
    214: "a host backup no longer matches its checksum",
    801: "sleep mode is off (set sleep_mode:True in CUSHIM_ALLOC_CONF)",
    900: "a CUDA graph capture is running",
}


class CushimError(RuntimeError):
    """A sleep-mode call failed; ``code`` is the CUDA error code it returned."""

    def __init__(self, what, code):
        self.code = code
        super().__init__(f"cushim {what} failed: CUDA error {code}: {_NAMES.get(code, 'driver error')}")


def _lib():
    lib = ctypes.CDLL(None)
    try:
        lib.cushim_pause
    except AttributeError:
        raise CushimError("lookup", 801) from None
    lib.cushim_tag_push.argtypes = [ctypes.c_char_p]
    lib.cushim_tag_pop.argtypes = []
    lib.cushim_pause.argtypes = [ctypes.c_char_p, ctypes.c_int]
    lib.cushim_resume.argtypes = [ctypes.c_char_p]
    lib.cushim_paused_bytes.argtypes = [ctypes.c_char_p]
    lib.cushim_paused_bytes.restype = ctypes.c_longlong
    return lib


_LIB = None


def _get():
    global _LIB
    if _LIB is None:
        _LIB = _lib()
    return _LIB


def available():
    """Whether the shim is preloaded into this process."""
    try:
        _get()
        return True
    except CushimError:
        return False


def _tag(tag):
    return None if tag is None else str(tag).encode()


def _check(what, rc):
    if rc != 0:
        raise CushimError(what, rc)


def tag_push(tag):
    """Tag this thread's next allocations ``tag`` (nests)."""
    _check("tag_push", _get().cushim_tag_push(_tag(tag)))


def tag_pop():
    """Close this thread's innermost tag."""
    _check("tag_pop", _get().cushim_tag_pop())


@contextlib.contextmanager
def region(tag):
    """Allocations made inside the block are tagged ``tag``."""
    tag_push(tag)
    try:
        yield
    finally:
        tag_pop()


def pause(tag=None, backup=False):
    """Give back the device memory of ``tag`` (None: every tag), keeping its addresses;
    with ``backup`` its contents are kept in host memory and restored by resume. Returns
    the bytes now paused for ``tag``."""
    _check("pause", _get().cushim_pause(_tag(tag), 1 if backup else 0))
    return paused_bytes(tag)


def resume(tag=None):
    """Map device memory again under ``tag`` (None: every tag) and restore backups. All or
    nothing: on failure (CushimError) the tag stays paused and can be resumed later."""
    _check("resume", _get().cushim_resume(_tag(tag)))


def paused_bytes(tag=None):
    """Bytes of ``tag`` (None: every tag) now paused."""
    n = _get().cushim_paused_bytes(_tag(tag))
    if n < 0:
        raise CushimError("paused_bytes", 801)
    return n
