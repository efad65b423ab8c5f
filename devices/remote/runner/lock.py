"""The board lock: one campaign holds a board at a time, through an flock the kernel drops when its holder exits."""

import json
import os


def read_lock_holder(path):
    """The holder a board lock file names ({"host", "pid", "campaign", "since", "token", "lock_pid"}); {} when
    it names none (never taken, or being written this instant)."""
    try:
        with open(path) as f:
            doc = json.loads(f.read() or "{}")
    except (IOError, OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def take_lock(path, holder):
    """Try to take the board lock ``path`` (flock, exclusive, not waiting).

    Returns (result, fd): ({"ok": true, "holder": ...}, fd) when taken, the holder written into the file (with
    this process's pid as "lock_pid") so that a refused campaign can name it; ({"ok": false, "busy": true,
    "holder": {...}}, None) when another process holds it. The kernel drops the lock when this process exits,
    however it exits, so a board is never left locked by a dead campaign."""
    import errno
    import fcntl

    folder = os.path.dirname(path)
    if folder and not os.path.isdir(folder):
        os.makedirs(folder)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except (IOError, OSError) as e:
        os.close(fd)
        if e.errno not in (errno.EAGAIN, errno.EACCES):
            raise
        return {"ok": False, "busy": True, "holder": read_lock_holder(path)}, None
    holder = dict(holder, lock_pid=os.getpid())
    data = json.dumps(holder, sort_keys=True).encode("utf-8")
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, 0)
    os.write(fd, data)
    os.fsync(fd)
    return {"ok": True, "holder": holder}, fd


def lock_held_by(path, token):
    """None when ``path`` is held (flocked) and names ``token``; else why not (no runner may be killed then)."""
    import errno
    import fcntl

    if not os.path.isfile(path):
        return "the board lock %s does not exist" % path
    fd = os.open(path, os.O_RDWR)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except (IOError, OSError) as e:
            if e.errno not in (errno.EAGAIN, errno.EACCES):
                raise
        else:
            return "nobody holds the board lock %s" % path
    finally:
        os.close(fd)  # releases it if this call took it
    holder = read_lock_holder(path)
    if holder.get("token") != token:
        return "the board lock %s is held by campaign %r of %s pid %s, not by the caller" % (
            path, holder.get("campaign"), holder.get("host"), holder.get("pid"))
    return None
