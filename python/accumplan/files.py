"""accumplan.files — the plan's files: reading a regular file safely, its SHA-256, writing one
atomically, and a plan given as a dict turned into JSON text for the C++ reader.

What it is: the file handling of accumplan.plans, checked before anything is opened or written
(a FIFO is never waited on, a directory never replaced, nothing half-written left on disk). What
it is not: a plan reader (the C++ one reads the text).
"""

import hashlib
import json
import math
import os
import stat

from . import _core
from ._args import path_arg, shown_value
from .errors import PlanError

# A plan given as a dict is turned into JSON text for the reader: more values than this, or deeper
# nesting than the reader takes, is no plan (a dict sharing one list 2**60 times is refused, not
# expanded).
MAX_JSON_VALUES = 1 << 20
MAX_JSON_DEPTH = _core.MAX_JSON_DEPTH


def file_sha256(path):
    """The SHA-256 of the regular file at ``path``, in hex. Refuses, with PlanError naming the
    path and before opening it, a directory, a FIFO (never waited on), a device or a socket."""
    return file_digest(path, "path")


def file_digest(path, what):
    h = hashlib.sha256()
    with open_regular(path, what)[0] as f:
        try:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        except OSError as e:
            raise PlanError("cannot read %s %s: %s" % (what, shown_value(os.fsdecode(path)), e.strerror)) from None
    return h.hexdigest()


def open_regular(path, what):
    """(binary file object, os.stat_result) of the regular file at ``path`` (``what`` names it in
    messages: "plan", "model"). TypeError for a path that is not str, bytes or os.PathLike (an int
    would be a file descriptor); PlanError, before opening anything, for a missing path, a
    directory, a FIFO (which would block for ever), a device or a socket. Opened non-blocking and
    checked again, so a FIFO put in its place meanwhile is refused too."""
    try:
        path = path_arg(path, what)
    except ValueError as e:
        raise PlanError(str(e)) from None
    name = shown_value(os.fsdecode(path))
    try:
        st = os.stat(path)
        if stat.S_ISREG(st.st_mode):
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                os.close(fd)
    except OSError as e:
        raise PlanError("cannot read %s %s: %s" % (what, name, e.strerror)) from None
    if stat.S_ISDIR(st.st_mode):
        raise PlanError("%s %s is a directory; give the path of the %s file" % (what, name, what))
    if not stat.S_ISREG(st.st_mode):
        raise PlanError("%s %s is not a regular file (a FIFO, device or socket); give the path of the %s file"
                        % (what, name, what))
    return os.fdopen(fd, "rb"), st


def json_text(doc, source):
    """``doc`` (a plan as a dict) as JSON text for the C++ reader, which checks everything else.
    PlanError naming ``source`` for what JSON text cannot hold: a key that is not a string, a value
    that is no JSON value (a tensor, a set, a numpy number), NaN or infinity, more than
    MAX_JSON_VALUES values or nesting deeper than MAX_JSON_DEPTH. Iterative, and counted per
    occurrence: a list shared 2**60 times is refused, never expanded."""
    count, stack = 0, [(doc, "$", 1)]
    while stack:
        obj, path, depth = stack.pop()
        count += len(obj)
        if count > MAX_JSON_VALUES:
            raise PlanError("%s: more than %d JSON values; a plan holds hundreds" % (source, MAX_JSON_VALUES))
        is_dict = isinstance(obj, dict)
        for k, v in (obj.items() if is_dict else enumerate(obj)):
            if is_dict and not isinstance(k, str):
                raise PlanError("%s: %s has the key %s; JSON keys are strings" % (source, path, shown_value(k)))
            where = "%s.%s" % (path, k) if is_dict else "%s[%d]" % (path, k)
            shown = where if len(where) <= 160 else where[:157] + "..."  # as the C++ reader cuts a path
            if isinstance(v, (dict, list, tuple)):
                if depth >= MAX_JSON_DEPTH:
                    raise PlanError("%s: %s: nested deeper than %d levels; accumplan's documents nest 4"
                                    % (source, shown, MAX_JSON_DEPTH))
                stack.append((v, where, depth + 1))
            elif type(v) is float and not math.isfinite(v):
                raise PlanError("%s: %s: %s is not a JSON number; a plan holds finite numbers" % (source, shown, v))
            elif not (v is None or type(v) in (str, bool, int, float)):
                raise PlanError("%s: %s: a value of type %s is not JSON" % (source, shown, type(v).__name__))
    try:
        return json.dumps(doc)
    except ValueError as e:  # an int of more than 4300 digits
        raise PlanError("%s: %s" % (source, e)) from None


def output_path(path, name):
    """The real path a file can be written at, checked before anything is written, as the C++
    CLI's check_outputs does: TypeError for a path that is not one; ValueError naming ``name`` for
    '', a directory, a FIFO, device or socket (save replaces a file, it writes no stream), a
    missing directory or one this process cannot write in."""
    path = os.fsdecode(path_arg(path, name))
    shown = "%s %s" % (name, shown_value(path))
    real = os.path.realpath(path)
    try:
        mode = os.stat(path).st_mode  # as given: realpath drops a trailing '/'; stat does not
    except FileNotFoundError:
        mode = None
    except OSError as e:
        raise ValueError("%s: %s" % (shown, e.strerror)) from None
    if mode is not None and stat.S_ISDIR(mode):
        raise ValueError("%s is a directory; give a file name inside it" % shown)
    if mode is not None and not stat.S_ISREG(mode):
        raise ValueError("%s is not a regular file (a FIFO, device or socket); give a file name" % shown)
    # 'p.json/' names a directory p.json, which the CLI refuses as missing; realpath would make
    # it the file p.json.
    parent = real if path.endswith(("/", os.sep)) else os.path.dirname(real)
    if not os.path.isdir(parent):
        raise ValueError("%s: no such directory %s; create it first or choose another path" % (shown, shown_value(parent)))
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError("%s: the directory %s is not writable; choose another path" % (shown, shown_value(parent)))
    return real


def write_atomically(path, text, what):
    """``text`` into a temporary file beside ``path``, synced, renamed over it; the temporary file
    is removed on any error, an OSError raised as ValueError naming ``what`` ("the plan") and
    ``path``. Keeps an existing file's mode, else the umask's."""
    import tempfile
    try:
        fd, tmp = tempfile.mkstemp(prefix=".%s." % os.path.basename(path), suffix=".tmp", dir=os.path.dirname(path))
        try:
            with os.fdopen(fd, "w") as f:
                # mkstemp makes the file 0600; a plan is as readable as any file the user creates.
                mask = os.umask(0)
                os.umask(mask)
                os.chmod(tmp, (os.stat(path).st_mode & 0o777) if os.path.exists(path) else (0o666 & ~mask))
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
    except OSError as e:
        raise ValueError("cannot write %s to %s: %s" % (what, shown_value(path), e.strerror or e)) from None
    try:  # the rename itself survives a power loss once the directory is synced
        dfd = os.open(os.path.dirname(path), os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass
