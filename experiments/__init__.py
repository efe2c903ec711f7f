"""hogrod's experiment binaries: `python -m experiments.NAME` or the console command
`hogrod-NAME` (see pyproject.toml's [project.scripts] and hogrod/harness.py).

Importing this package as a binary (`python -m experiments.NAME`, a `hogrod-*` command)
drops the lines TensorFlow's C++ code writes to stderr on every start and whenever it
compiles, before it is imported: the "Could not find cuda drivers" and oneDNN /
CPU-instruction notices, absl's "log messages before absl::InitializeLog()" banner, XLA's
service and compilation notices, the cost estimator's "Not handling type DT_DOUBLE" and
"Error in PredictCost()" (for float64 ops it cannot cost) and, on a machine without an
NVIDIA driver, "failed call to cuInit" (also the one written at teardown). Every other
line, warnings and errors included, passes unchanged. HOGROD_NATIVE_NOISE=1 keeps them all. Imported as a library (tests,
notebooks) it changes nothing.
"""

import os
import re
import signal
import sys

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
    rb"^I\d{4} [\d:.]+ +\d+ service\.cc:\d+\] (XLA service 0x[0-9a-f]+ initialized for "
    rb"platform|  StreamExecutor \[\d+\]: )",
    rb"^I\d{4} [\d:.]+ +\d+ dump_mlir_util\.cc:\d+\] disabling MLIR crash reproducer",
    rb"^I\d{4} [\d:.]+ +\d+ device_compiler\.h:\d+\] Compiled cluster using XLA!",
    rb"^[IW]\d{4} [\d:.]+ +\d+ util\.cc:\d+\] Not handling type DT_\w+$",
    rb"^W\d{4} [\d:.]+ +\d+ op_level_cost_estimator\.cc:\d+\] Error in PredictCost\(\) "
    rb"for the op: ",
]
if not os.path.exists("/proc/driver/nvidia"):  # no driver: a failed cuInit is expected
    _NOISE.append(rb"^E\d{4} [\d:.]+ +\d+ cuda_\w+\.cc:\d+\] .*[Ff]ailed call to cuInit")
NOISE = re.compile(b"|".join(b"(?:%s)" % p for p in _NOISE))


def filter_native_stderr(noise=NOISE):
    """Route file descriptor 2 through a child process that drops the lines matching `noise`.

    TensorFlow's C++ logging writes to the descriptor directly, so Python's logging filters
    cannot reach it. The filter is a process, not a thread, so it also filters what C++ code
    writes while the interpreter shuts down; it ends when the last writer (the binary and
    any process it started) has closed the pipe, after writing out what it holds.

    Args:
      noise: a compiled bytes pattern; a line it matches (from the start) is dropped.
    Returns:
      The filter's process id.
    """
    sys.stderr.flush()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the filter: Ctrl-C or a kill of the group must not cut the binary's stderr
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        os.close(write_end)
        try:
            with os.fdopen(read_end, "rb") as lines, os.fdopen(2, "wb", 0) as out:
                for line in lines:
                    if not noise.match(line.rstrip(b"\r\n")):
                        out.write(line)
        finally:
            os._exit(0)
    os.close(read_end)
    os.dup2(write_end, 2)
    os.close(write_end)
    return pid


def _started_as_binary():
    # While `python -m experiments.NAME` imports this package, sys.argv[0] is "-m"; a
    # console command's is its script, hogrod-NAME.
    argv0 = sys.argv[0] if sys.argv else ""
    return argv0 == "-m" or os.path.basename(argv0).startswith("hogrod-")


if _started_as_binary() and os.environ.get("HOGROD_NATIVE_NOISE") != "1" \
        and "tensorflow" not in sys.modules:
    filter_native_stderr()
