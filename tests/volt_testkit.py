"""What every folder of Python tests shares (each folder's conftest.py puts tests/ on sys.path):

free_port()              a TCP port for a test's server or rendezvous that no other test process gets
require(ok, reason)      a missing prerequisite: a failure under CI=true, a skip elsewhere
import_from(folder, *modules)  a Python peer that scripts/setup.sh installs in a folder of its own
"""
import fcntl
import importlib
import os
import random
import socket
import sys

import pytest

# Where the ports handed out are locked: one file per port, shared by every test process of the machine.
PORT_LOCKS = "/tmp/volt-test-ports"
# Below Linux's ephemeral range, which the kernel hands out for port 0 (Gloo's own listeners) and for
# the local end of every outgoing connection: a port taken from there could be taken again meanwhile.
_FIRST_PORT = 20000
_held = {}  # port -> its lock file, open (so locked) for the life of this process


def _ephemeral_start():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(port):
    """Nothing listens on `port` or lingers there (TIME_WAIT): binding without SO_REUSEADDR works."""
    for family, address in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
        try:
            s = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue  # no IPv6 on this machine
        try:
            s.bind((address, port))
        except OSError:
            return False
        finally:
            s.close()
    return True


def _lock(port):
    """The lock file of `port`, locked by this process; None when another process holds it."""
    fd = os.open(os.path.join(PORT_LOCKS, f"{port}.lock"), os.O_RDONLY | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def free_port():
    """A TCP port that is free now and that no other process using this function gets while this one
    lives. Asking the kernel for port 0 and releasing it, as the tests once did, let two tests run
    beside each other by CTest (-j) be handed the same port before either bound it. Here each port
    handed out stays locked (an flock on PORT_LOCKS/<port>.lock) until this test process exits."""
    os.makedirs(PORT_LOCKS, exist_ok=True)
    try:
        os.chmod(PORT_LOCKS, 0o1777)  # the tests of another user share it too (like /tmp)
    except PermissionError:
        pass
    end = _ephemeral_start()
    ports = list(range(_FIRST_PORT, end))
    # Each process starts at its own place in the range, so that concurrent ones rarely meet.
    start = random.Random(os.getpid()).randrange(len(ports))
    for port in ports[start:] + ports[:start]:
        if port in _held:
            continue
        fd = _lock(port)
        if fd is None:
            continue
        if not _bindable(port):
            os.close(fd)
            continue
        _held[port] = fd
        return port
    raise RuntimeError(f"no free port in [{_FIRST_PORT}, {end}) that {PORT_LOCKS} does not lock")


def on_ci():
    """Whether this is a CI run (CI=true), where every test must run."""
    return os.environ.get("CI", "").lower() in ("true", "1")


def require(condition, reason):
    """Goes on when `condition` holds. Otherwise the calling test (or, at module level, the whole
    module) is skipped with `reason`, visibly; under CI=true it fails with `reason` instead, since a
    skipped test there would only look like a passed one."""
    __tracebackhide__ = True  # pytest names the caller's line, not this one
    if condition:
        return
    if on_ci():
        pytest.fail(f"{reason} (CI=true: a missing prerequisite is a failure)", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def import_from(folder, *modules):
    """Imports `modules`, in order, with `folder` first on sys.path, and returns them: a peer that
    scripts/setup.sh installs in a folder of its own, so /usr/bin/python3 keeps Debian's packages. A
    module that does not import is a missing prerequisite (require), named with the folder."""
    __tracebackhide__ = True
    sys.path.insert(0, str(folder))
    try:
        return [importlib.import_module(module) for module in modules]
    except ImportError as error:
        require(False, f"{modules[0]} is not importable from {folder}: run scripts/setup.sh ({error})")
