"""TensorFlow's start-up noise, dropped from a hogrod binary's stderr.

A binary (a `hogrod-NAME` console command, or `python -m experiments.NAME` from the
repository) drops a few lines TensorFlow's C++ code writes to stderr on every start: the
"Could not find cuda drivers" and oneDNN / CPU-instruction notices (oneDNN's int32
fallback to Eigen included), absl's "log messages before absl::InitializeLog()" banner,
and, on a machine without an NVIDIA driver, "failed call to cuInit". Every other line,
warnings and errors included, passes unchanged. HOGROD_NATIVE_NOISE=1 keeps them all. The
filter must be in place before TensorFlow is imported, so `hogrod/__init__.py` imports this
module first; in any other program (tests, notebooks, a user's script) importing hogrod
changes nothing.
"""

import atexit
import os
import re
import sys
import threading
from typing import Callable, Optional, Sequence

__all__ = ["NOISE", "filter_native_stderr", "started_as_binary"]

# Each pattern names the C++ source file that logs the line, so Python's own log lines
# (absl writes the same "I1122 12:00:00 ... file.py:12]" prefix) never match.
_NOISE = [
    rb"^WARNING: All log messages before absl::InitializeLog\(\) is called are written to "
    rb"STDERR$",
    rb"^I\d{4} [\d:.]+ +\d+ cudart_stub\.cc:\d+\] Could not find cuda drivers on your machine",
    rb"^I\d{4} [\d:.]+ +\d+ port\.cc:\d+\] oneDNN custom operations are on",
    rb"^I\d{4} [\d:.]+ +\d+ cpu_feature_guard\.cc:\d+\] This TensorFlow binary is optimized",
    rb"^To enable the following instructions: .* rebuild TensorFlow with the appropriate "
    rb"compiler flags\.$",
    # XLA's service and compilation notices, and the cost estimator on float64 ops
    rb"^I\d{4} [\d:.]+ +\d+ service\.cc:\d+\] (XLA service 0x[0-9a-f]+ initialized for "
    rb"platform|  StreamExecutor \[\d+\]: )",
    rb"^I\d{4} [\d:.]+ +\d+ dump_mlir_util\.cc:\d+\] disabling MLIR crash reproducer",
    rb"^I\d{4} [\d:.]+ +\d+ device_compiler\.h:\d+\] Compiled cluster using XLA!",
    rb"^[IW]\d{4} [\d:.]+ +\d+ util\.cc:\d+\] Not handling type DT_\w+$",
    # oneDNN without AVX-512 kernels for int32 ops (an error-level notice, harmless)
    rb"^E\d{4} [\d:.]+ +\d+ util\.cc:\d+\] oneDNN supports DT_\w+ only on platforms with "
    rb"AVX-512\. Falling back to the default Eigen-based implementation if present\.$",
    rb"^W\d{4} [\d:.]+ +\d+ op_level_cost_estimator\.cc:\d+\] Error in PredictCost\(\) "
    rb"for the op: ",
]
if not os.path.exists("/proc/driver/nvidia"):  # no driver: a failed cuInit is expected
    _NOISE.append(rb"^E\d{4} [\d:.]+ +\d+ cuda_\w+\.cc:\d+\] .*[Ff]ailed call to cuInit")
NOISE = re.compile(b"|".join(b"(?:%s)" % p for p in _NOISE))


def filter_native_stderr(noise: re.Pattern = NOISE) -> Callable[[], None]:
    """Route file descriptor 2 through a thread that drops the lines matching `noise`.

    TensorFlow's C++ logging writes to the descriptor directly, so Python's logging
    filters cannot reach it. At exit the descriptor is restored and what is buffered is
    written out, so nothing printed last (an error message) is lost.

    Args:
      noise: a compiled bytes pattern; a line (without its line end) it matches is dropped.

    Returns:
      `restore()`, which puts the original descriptor back (also run at exit).
    """
    sys.stderr.flush()
    read_end, write_end = os.pipe()
    original = os.dup(2)
    os.dup2(write_end, 2)
    os.close(write_end)

    def pump():
        with os.fdopen(read_end, "rb") as lines, os.fdopen(os.dup(original), "wb", 0) as out:
            for line in lines:
                if not noise.match(line.rstrip(b"\r\n")):
                    out.write(line)

    thread = threading.Thread(target=pump, name="stderr-filter", daemon=True)
    thread.start()

    def restore():
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os.dup2(original, 2)  # closes the pipe's last write end: the pump sees the end
        thread.join(timeout=2)

    atexit.register(restore)
    return restore


def started_as_binary(argv: Optional[Sequence[str]] = None,
                      orig_argv: Optional[Sequence[str]] = None) -> bool:
    """Whether this process is a hogrod binary: a `hogrod-NAME` console command, or `python -m`
    of a module under `experiments.` or `hogrod.experiments.`.

    Args:
      argv: the arguments to read (default `sys.argv`; a console command's first is its
        script, hogrod-NAME).
      orig_argv: the interpreter's own arguments (default `sys.orig_argv`; they hold
        `-m MODULE`).

    Returns:
      A bool.
    """
    argv = sys.argv if argv is None else argv
    orig_argv = getattr(sys, "orig_argv", []) if orig_argv is None else orig_argv
    if argv and os.path.basename(argv[0]).startswith("hogrod-"):
        return True
    args = iter(orig_argv[1:])
    for arg in args:  # the interpreter's options, up to the script, -c or -m
        if arg in ("-W", "-X"):  # an option with its value apart
            next(args, None)
        elif arg == "-m":
            return next(args, "").startswith(("experiments.", "hogrod.experiments."))
        elif arg == "-c" or arg == "-" or not arg.startswith("-"):
            return False
    return False


if started_as_binary() and os.environ.get("HOGROD_NATIVE_NOISE") != "1" \
        and "tensorflow" not in sys.modules:
    filter_native_stderr()
