"""A Mooncake Store on this machine: its master, its metadata server and one pool node, on 127.0.0.1.

Mooncake Store (Qin et al., FAST'25; https://github.com/kvcache-ai/Mooncake) is three kinds of
process. The **master** keeps the map from keys to where their bytes live and evicts when the
pool is full; a **metadata server** (HTTP) tells clients how to reach one another; **clients**
put and get values, and each may lend memory (its *global segment*) to the pool. The bytes of a
value live in some client's segment, so a pool that outlives the engines using it needs a client
whose only job is to lend memory: ``StoreServer`` starts one (the *pool node*) beside the master
and the metadata server, and engines join with no segment of their own.

Every process talks to 127.0.0.1 (``MC_TCP_BIND_ADDRESS=127.0.0.1`` for the clients, which otherwise
announce the machine's outward address). The master and the metadata server (Mooncake's own,
``mooncake.http_metadata_server``) listen on 127.0.0.1; a client's transfer engine listens on the
wildcard address (Mooncake binds it so). Where this process may create a network namespace (root,
``unshare``), ``StoreServer`` runs everything inside a fresh one whose only interface is loopback
(``isolate``): then no listener of the store is reachable from outside at all. Clients join it
with ``join_netns(server.netns)`` (a process, or one thread) before they start; ``in_netns`` runs a
function on a thread inside it. Logs go to files in ``log_dir``.

**Nothing outlives its parent.** Every process started here (``spawn``) dies with the Python
process that started it: ``stop()`` ends them; an ``atexit`` handler stops every server still
running when Python exits (a script that never calls ``stop()``, a notebook kernel shut down after
a cell raised); and each child carries a parent-death signal (Linux ``PR_SET_PDEATHSIG``, set
through ``setpriv`` or, without it, in the child before ``exec``), so a parent killed outright
(SIGKILL, a kernel restart that does not wait) takes them down too. The signal fires when the
*thread* that started a child ends, so start and restart a server from a thread that lives as long
as it (a script's or a notebook's main thread). A ``log_dir`` the server made itself (none given)
is removed by ``stop()`` -- unless something failed (``failed``: a start that did not finish, a
process that died on its own), when the logs are kept and a warning names the folder.

**The pool's secret.** ``StoreServer`` draws a secret of 32 random bytes when it starts
(``secret``) and writes it to a file only this user may read (``secret_path``), removed by
``stop()``; ``pool_secret(master)`` finds it again, in this process or in a replica started by
it, unless ``MINIMAX_LAB_POOL_SECRET`` (64 hex digits) names the secret of a pool started
elsewhere. The remote tier signs every value with it (``kvcache.pool_value``), so a writer who can
reach the pool but does not hold the secret cannot make a replica serve a tensor.

``store_unavailable()`` says why the store cannot run here (the client not installed, its system
libraries missing), or returns None. ``StoreServer`` raises ``StoreUnavailable`` with that reason.
"""
from __future__ import annotations

import atexit
import ctypes
import functools
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

HOST = "127.0.0.1"
INSTALL_HINT = ("pip install 'minimax-lab[store]' (the wheel mooncake-transfer-engine-non-cuda) and, on Debian "
                "or Ubuntu, apt-get install libibverbs1 libnuma1")
#: Environment of every Mooncake client this package starts: loopback only, a bounded RPC
#: timeout (the client's own default is 30 s) and warnings and errors only in its log.
CLIENT_ENV = {"MC_TCP_BIND_ADDRESS": HOST, "MC_RPC_TIMEOUT_MS": "2000", "MC_LOG_LEVEL": "WARNING"}

_POOL_NODE = """
import os, sys
from mooncake.store import MooncakeDistributedStore
store = MooncakeDistributedStore()
rc = store.setup(sys.argv[1], sys.argv[2], int(sys.argv[3]), 16 << 20, "tcp", "", sys.argv[4])
print("ready" if rc == 0 else f"setup failed: {rc}", flush=True)
if rc != 0:
    sys.exit(1)
sys.stdin.read()          # lend the segment until the parent closes stdin (or kills us)
os._exit(0)               # skip the client's slow unmount: the master forgets a dead client
"""


SECRET_ENV = "MINIMAX_LAB_POOL_SECRET"


def secret_path(master_address: str) -> Path:
    """Where the secret of the pool whose master is at ``master_address`` is kept: a file in a
    folder of this user's only (mode 0700), named by the address."""
    return Path(tempfile.gettempdir()) / f"minimax-lab-pools-{os.getuid()}" / f"{master_address.replace(':', '_')}.key"


def pool_secret(master_address: str | None) -> bytes | None:
    """The secret of the pool at ``master_address``: ``$MINIMAX_LAB_POOL_SECRET`` (64 hex digits)
    if set, else the file a ``StoreServer`` on this machine wrote (``secret_path``), else None.
    Raises ``ValueError`` for an environment value that is not 64 hex digits."""
    env = os.environ.get(SECRET_ENV)
    if env:
        try:
            secret = bytes.fromhex(env)
        except ValueError:
            secret = b""
        if len(secret) != 32:
            raise ValueError(f"{SECRET_ENV} must be 64 hex digits (a 32-byte pool secret)")
        return secret
    if not master_address:
        return None
    try:
        secret = secret_path(master_address).read_bytes()
    except OSError:
        return None
    return secret if len(secret) == 32 else None


def _write_secret(master_address: str, secret: bytes) -> Path:
    path = secret_path(master_address)
    path.parent.mkdir(mode=0o700, exist_ok=True)
    os.chmod(path.parent, 0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(secret)
    return path


class StoreUnavailable(RuntimeError):
    """Mooncake Store cannot run here; the message says why and how to fix it."""


def client_environment() -> None:
    """Put ``CLIENT_ENV`` into this process's environment (values already set are kept).
    Call before the first ``import mooncake.store``."""
    for k, v in CLIENT_ENV.items():
        os.environ.setdefault(k, v)


def store_unavailable() -> str | None:
    """Why Mooncake Store cannot run in this Python, or None when it can: the client must import
    (its wheel installed, ``libibverbs1``/``libnuma1`` present) and ``mooncake_master`` must exist."""
    client_environment()
    try:
        import mooncake.store  # noqa: F401  # deferred: optional dependency (minimax-lab[store])
    except ImportError as e:
        missing = "libibverbs" in str(e) or "libnuma" in str(e) or ".so" in str(e)
        what = f"its system libraries are missing ({e})" if missing else f"its client is not installed ({e})"
        return f"Mooncake Store cannot start: {what}. Install: {INSTALL_HINT}."
    if master_binary() is None:
        return f"Mooncake Store cannot start: mooncake_master is not on PATH or beside {sys.executable}. " \
               f"Install: {INSTALL_HINT}."
    return None


_CLONE_NEWNET = 0x40000000
_PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int | None = None) -> None:
    """Ask Linux to SIGKILL the calling process when the thread that started it ends
    (``PR_SET_PDEATHSIG``); if ``parent_pid`` is given and that process is already gone (it died
    before the request took effect), exit at once. Elsewhere than Linux: nothing."""
    if not sys.platform.startswith("linux"):
        return
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(1)


@functools.lru_cache(maxsize=1)
def _setpriv() -> str | None:
    """``setpriv`` if it can set a parent-death signal (util-linux 2.33 or later), else None."""
    path = shutil.which("setpriv")
    if path is None:
        return None
    try:
        out = subprocess.run([path, "--help"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return path if "--pdeathsig" in out else None


def spawn(argv: list[str], **kw) -> subprocess.Popen:
    """``subprocess.Popen(argv, **kw)`` in a new session, killed when this process dies (module
    docstring): ``setpriv --pdeathsig KILL`` runs in front of ``argv`` (it ``exec``s it, so the
    pid is the program's), or the child sets the signal itself where ``setpriv`` is missing."""
    if sys.platform.startswith("linux"):
        wrapper = _setpriv()
        if wrapper is not None:
            argv = [wrapper, "--pdeathsig", "KILL", "--", *argv]
        else:
            kw["preexec_fn"] = functools.partial(die_with_parent, os.getpid())
    return subprocess.Popen(argv, start_new_session=True, **kw)


def join_netns(path: str | None) -> None:
    """Move the calling thread into the network namespace at ``path`` (``/proc/PID/ns/net``); threads
    and processes it starts afterwards are in it too. None: nothing. Raises ``OSError`` on failure."""
    if path is None:
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        if ctypes.CDLL(None, use_errno=True).setns(fd, _CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({path}): {os.strerror(err)}")
    finally:
        os.close(fd)


def in_netns(path: str | None, fn, *args, timeout_s: float = 60.0):
    """``fn(*args)`` on a new thread inside the namespace ``path`` (directly when None)."""
    if path is None:
        return fn(*args)
    box: dict = {}

    def run():
        try:
            join_netns(path)
            box["value"] = fn(*args)
        except BaseException as e:  # noqa: BLE001 -- re-raised in the caller
            box["error"] = e
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout_s)
    if "error" in box:
        raise box["error"]
    if t.is_alive():
        raise TimeoutError(f"{getattr(fn, '__name__', fn)} did not return within {timeout_s} s")
    return box.get("value")


@functools.lru_cache(maxsize=1)
def netns_available() -> bool:
    """Whether this process may make a network namespace with loopback up and join it."""
    if os.geteuid() != 0 or not all(shutil.which(b) for b in ("unshare", "ip")):
        return False
    try:
        holder = _netns_holder()
    except (OSError, StoreUnavailable):
        return False
    try:
        in_netns(f"/proc/{holder.pid}/ns/net", lambda: socket.create_server((HOST, 0)).close(), timeout_s=10)
        return True
    except (OSError, TimeoutError):
        return False
    finally:
        _stop(holder)


def _netns_holder() -> subprocess.Popen:
    """A process in a new network namespace with loopback up, holding it open until stopped."""
    holder = spawn(["unshare", "--net", "sh", "-c", "ip link set lo up && echo ready && exec sleep infinity"],
                   stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    line = holder.stdout.readline()
    if line.strip() != b"ready":
        _stop(holder)
        raise StoreUnavailable("could not make a network namespace with loopback up")
    return holder


def master_binary() -> str | None:
    """Path of ``mooncake_master``: beside this Python (a venv's bin/) first, then on ``PATH``."""
    here = Path(sys.executable).parent / "mooncake_master"
    return str(here) if here.exists() else shutil.which("mooncake_master")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _listening(port: int) -> bool:
    try:
        socket.create_connection((HOST, port), timeout=0.2).close()
        return True
    except OSError:
        return False


def _wait_port(port: int, deadline: float, proc: subprocess.Popen, what: str, log: Path,
               netns: str | None = None) -> None:
    while True:
        if proc.poll() is not None:
            raise StoreUnavailable(f"{what} exited with code {proc.returncode} at start; its log: {log}")
        try:
            if not in_netns(netns, _listening, port):
                raise OSError
            return
        except OSError:
            if time.monotonic() > deadline:
                raise StoreUnavailable(f"{what} did not listen on {HOST}:{port} in time; its log: {log}") from None
            time.sleep(0.05)


def _stop(proc: subprocess.Popen | None, grace_s: float = 3.0) -> None:
    if proc is None or proc.poll() is not None:
        return
    try:
        if proc.stdin is not None:
            proc.stdin.close()
        proc.send_signal(signal.SIGCONT)      # a paused process cannot handle SIGTERM
        proc.terminate()
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    except OSError:
        pass


@dataclass
class StoreServer:
    """Master + metadata server + pool node on free ports of 127.0.0.1 (module docstring).

    ``start()`` returns once all three answer (raises ``StoreUnavailable`` with the reason and the
    log's path otherwise, leaving nothing running); ``stop()`` stops all three and is safe to call
    twice. Use it as a context manager. Fault injection for the chapter and the tests:
    ``kill_master()``, ``restart_master()`` (empty: the pool node lends its memory again, the
    blocks are gone), ``pause_master()``/``resume_master()`` (the master stops answering: calls
    time out). ``lease_ms`` is how long the master refuses to remove a value after it was read.
    ``isolate``: run in a fresh network namespace (None: where ``netns_available()``); its path is
    ``netns`` (None when not isolated), which clients must join. ``log_dir`` None: a temporary
    folder, removed by ``stop()`` unless ``failed`` (module docstring); a given folder is kept.
    ``secret``: the pool's 32-byte secret (random by default), published for ``pool_secret`` while
    the server runs (module docstring).
    """

    pool_bytes: int = 256 << 20
    log_dir: Path | None = None
    lease_ms: int = 1000
    master_port: int = 0
    metadata_port: int = 0
    metrics_port: int = 0
    master: subprocess.Popen | None = field(default=None, repr=False)
    metadata: subprocess.Popen | None = field(default=None, repr=False)
    pool_node: subprocess.Popen | None = field(default=None, repr=False)
    isolate: bool | None = None
    netns: str | None = None
    holder: subprocess.Popen | None = field(default=None, repr=False)
    failed: bool = False
    secret: bytes = field(default_factory=lambda: secrets.token_bytes(32), repr=False)
    _own_log_dir: bool = field(default=False, repr=False)
    _killed: list = field(default_factory=list, repr=False)      # processes stopped on purpose

    @property
    def master_address(self) -> str:
        return f"{HOST}:{self.master_port}"

    @property
    def metadata_url(self) -> str:
        return f"http://{HOST}:{self.metadata_port}/metadata"

    def log(self, name: str) -> Path:
        return Path(self.log_dir) / f"{name}.log"

    def start(self, timeout_s: float = 30.0) -> "StoreServer":
        reason = store_unavailable()
        if reason:
            raise StoreUnavailable(reason)
        self._own_log_dir = self.log_dir is None
        self.log_dir = Path(self.log_dir or tempfile.mkdtemp(prefix="mooncake-"))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.master_port, self.metadata_port, self.metrics_port = free_port(), free_port(), free_port()
        _LIVE[id(self)] = self
        try:
            if self.isolate or (self.isolate is None and netns_available()):
                self.holder = _netns_holder()
                self.netns = f"/proc/{self.holder.pid}/ns/net"
            self._start_metadata(timeout_s)
            self._start_master(timeout_s)
            self._start_pool_node(timeout_s)
            _write_secret(self.master_address, self.secret)
        except BaseException:
            self.failed = True
            self.stop()
            raise
        return self

    def _spawn(self, name: str, argv: list[str], **kw) -> subprocess.Popen:
        env = dict(os.environ, **CLIENT_ENV)
        if self.netns is not None:
            argv = ["nsenter", f"--net={self.netns}", "--", *argv]
        with open(self.log(name), "ab") as out:
            return spawn(argv, stdout=kw.pop("stdout", out), stderr=out, env=env, **kw)

    def _start_metadata(self, timeout_s: float) -> None:
        self.metadata = self._spawn("metadata", [sys.executable, "-m", "mooncake.http_metadata_server",
                                                 "--host", HOST, "--port", str(self.metadata_port),
                                                 "--log-level", "WARNING"])
        _wait_port(self.metadata_port, time.monotonic() + timeout_s, self.metadata, "the metadata server",
                   self.log("metadata"), self.netns)

    def _start_master(self, timeout_s: float) -> None:
        self.master = self._spawn("master", [
            master_binary(), f"--rpc_address={HOST}", f"--rpc_port={self.master_port}",
            f"--metrics_host={HOST}", f"--metrics_port={self.metrics_port}",
            f"--default_kv_lease_ttl={self.lease_ms}", "--enable_metric_reporting=false",
            "--logtostderr=true"])
        _wait_port(self.master_port, time.monotonic() + timeout_s, self.master, "mooncake_master", self.log("master"),
                   self.netns)

    def _start_pool_node(self, timeout_s: float) -> None:
        self.pool_node = self._spawn("pool_node", [sys.executable, "-c", _POOL_NODE, HOST, self.metadata_url,
                                                   str(self.pool_bytes), self.master_address],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        deadline = time.monotonic() + timeout_s
        line = b""
        os.set_blocking(self.pool_node.stdout.fileno(), False)
        while not line.endswith(b"\n"):
            chunk = self.pool_node.stdout.readline()
            line += chunk or b""
            if self.pool_node.poll() is not None or time.monotonic() > deadline:
                raise StoreUnavailable(f"the pool node did not start ({line.decode(errors='replace').strip() or 'no answer'}); "
                                       f"its log: {self.log('pool_node')}")
            if not chunk:
                time.sleep(0.05)
        if line.strip() != b"ready":
            raise StoreUnavailable(f"the pool node did not start: {line.decode(errors='replace').strip()}; "
                                   f"its log: {self.log('pool_node')}")

    # ---- faults ----------------------------------------------------------------------------
    def kill_master(self) -> None:
        """SIGKILL the master: every call fails until ``restart_master``."""
        if self.master is not None and self.master.poll() is None:
            self._killed.append(self.master)
            self.master.kill()
            self.master.wait()

    def restart_master(self, timeout_s: float = 30.0) -> None:
        """Start a new, empty master on the same port (the old one is killed first)."""
        self.kill_master()
        self._start_master(timeout_s)

    def pause_master(self) -> None:
        """SIGSTOP the master: it accepts connections but never answers (calls time out)."""
        self.master.send_signal(signal.SIGSTOP)

    def resume_master(self) -> None:
        self.master.send_signal(signal.SIGCONT)

    def alive(self) -> bool:
        return all(p is not None and p.poll() is None for p in (self.master, self.metadata, self.pool_node))

    def stop(self) -> None:
        """Stop every process (safe to call twice). A process found dead that was not stopped on
        purpose marks the server ``failed``; the folder the server made for its logs is then kept
        (a warning names it), else removed."""
        procs = [p for p in (self.pool_node, self.master, self.metadata, self.holder) if p is not None]
        if any(p.poll() is not None and p not in self._killed for p in procs):
            self.failed = True
        for p in procs:
            self._killed.append(p)
            _stop(p)
        if self.master_port:
            try:
                if secret_path(self.master_address).read_bytes() == self.secret:
                    secret_path(self.master_address).unlink()
            except OSError:
                pass
        _LIVE.pop(id(self), None)
        if self._own_log_dir and self.log_dir is not None and Path(self.log_dir).exists():
            if self.failed:
                warnings.warn(f"Mooncake Store: something failed; its logs are kept in {self.log_dir}",
                              RuntimeWarning, stacklevel=2)
            else:
                shutil.rmtree(self.log_dir, ignore_errors=True)

    def __enter__(self) -> "StoreServer":
        return self.start() if self.master is None else self

    def __exit__(self, *exc) -> None:
        self.stop()


#: servers started and not yet stopped, stopped at interpreter exit
_LIVE: dict[int, StoreServer] = {}


@atexit.register
def _stop_all() -> None:
    for server in list(_LIVE.values()):
        server.stop()


def start_store(**kw) -> tuple[StoreServer | None, str | None]:
    """``(a started StoreServer(**kw), None)``, or ``(None, why)`` where it cannot start here."""
    server = StoreServer(**kw)
    try:
        return server.start(), None
    except StoreUnavailable as e:
        server.stop()
        return None, str(e)
