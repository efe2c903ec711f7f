"""hogrod's experiment binaries: `python -m experiments.NAME` or the console command
`hogrod-NAME` (see pyproject.toml's [project.scripts] and hogrod/harness.py).

Importing this package as a binary (`python -m experiments.NAME`, a `hogrod-*` command)
drops a few lines TensorFlow's C++ code writes to stderr on every start, before it is
imported: the "Could not find cuda drivers" and oneDNN / CPU-instruction notices, absl's
"log messages before absl::InitializeLog()" banner, and, on a machine without an NVIDIA
driver, "failed call to cuInit". Every other line, warnings and errors included, passes
unchanged. HOGROD_NATIVE_NOISE=1 keeps them all. Imported as a library (tests, notebooks)
it changes nothing.
"""

import atexit
import os
import re
import sys
import threading

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
]
if not os.path.exists("/proc/driver/nvidia"):  # no driver: a failed cuInit is expected
    _NOISE.append(rb"^E\d{4} [\d:.]+ +\d+ cuda_\w+\.cc:\d+\] failed call to cuInit")
NOISE = re.compile(b"|".join(b"(?:%s)" % p for p in _NOISE))


def filter_native_stderr(noise=NOISE):
    """Route file descriptor 2 through a thread that drops the lines matching `noise`.

    TensorFlow's C++ logging writes to the descriptor directly, so Python's logging
    filters cannot reach it. At exit the descriptor is restored and what is buffered is
    written out, so nothing printed last (an error message) is lost.
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


def _started_as_binary():
    # While `python -m experiments.NAME` imports this package, sys.argv[0] is "-m"; a
    # console command's is its script, hogrod-NAME.
    argv0 = sys.argv[0] if sys.argv else ""
    return argv0 == "-m" or os.path.basename(argv0).startswith("hogrod-")


if _started_as_binary() and os.environ.get("HOGROD_NATIVE_NOISE") != "1" \
        and "tensorflow" not in sys.modules:
    filter_native_stderr()
