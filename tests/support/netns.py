"""Hosts made of network namespaces, for jobs placed across "machines" by mpirun.

:class:`NetnsHosts` makes a hub namespace holding a bridge and one namespace per host,
each with a veth pair to the hub and an address in ``SUBNET`` (a private /24 that exists
only inside them); nothing is added to this machine's own namespace. A process runs "on"
host i with :meth:`NetnsHosts.on` (``ip netns exec``, in its own UTS namespace whose
hostname is the host's, as Open MPI tells hosts apart by name). mpirun reaches the other
hosts through :attr:`NetnsHosts.agent`, a script standing in for ssh
(``PRTE_MCA_plm_ssh_agent``): it runs the command in the namespace of the host it is
given, and logs each launch. :meth:`NetnsHosts.delete` removes every namespace made.
:func:`mpi_hosts` is a test's two-host fixture body (skipped, with the reason, where
namespaces or mpirun are missing).
"""

import contextlib
import os
import shutil
import subprocess
import sys
import textwrap

SUBNET = "10.213.78"


def _ip(*args, check=True):
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30,
                          check=check)


def why_no_netns():
    """None when this process can make network namespaces, else why not."""
    if os.geteuid() != 0:
        return "network namespaces need root (CAP_SYS_ADMIN, CAP_NET_ADMIN)"
    for tool in ("ip", "unshare"):
        if shutil.which(tool) is None:
            return f"no {tool} command (iproute2, util-linux)"
    probe = f"pfprobe{os.getpid() % 100000}"
    r = _ip("netns", "add", probe, check=False)
    if r.returncode != 0:
        return f"the kernel refuses a network namespace: {r.stderr.strip()}"
    try:
        r = _ip("-n", probe, "link", "add", "v0", "type", "veth", "peer", "name", "v1",
                check=False)
        if r.returncode != 0:
            return f"the kernel refuses a veth pair: {r.stderr.strip()}"
        r = _ip("-n", probe, "link", "add", "b0", "type", "bridge", check=False)
        if r.returncode != 0:
            return f"the kernel refuses a bridge: {r.stderr.strip()}"
    finally:
        _ip("netns", "del", probe, check=False)
    return None


def bridge_namespaces(hub, names, addrs, made):
    """Namespace ``hub`` with a bridge, and one namespace per name with a veth pair to
    it (``eth0`` inside) holding its address (/24); each namespace made is appended to
    ``made`` as soon as it exists (the caller deletes them, whatever happens)."""
    def add(ns):
        _ip("netns", "add", ns)
        made.append(ns)

    add(hub)
    _ip("-n", hub, "link", "set", "lo", "up")
    _ip("-n", hub, "link", "add", "br0", "type", "bridge")
    _ip("-n", hub, "link", "set", "br0", "up")
    for i, (ns, addr) in enumerate(zip(names, addrs)):
        add(ns)
        _ip("-n", hub, "link", "add", f"p{i}", "type", "veth", "peer", "name", "eth0",
            "netns", ns)
        _ip("-n", hub, "link", "set", f"p{i}", "master", "br0")
        _ip("-n", hub, "link", "set", f"p{i}", "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")


class NetnsHosts:
    """``n`` hosts ``SUBNET.1`` .. ``SUBNET.n`` joined by a bridge (see the module)."""

    def __init__(self, n, workdir, subnet=SUBNET):
        tag = f"pf{os.getpid() % 100000}h"
        self.hub = f"{tag}hub"
        self.names = [f"{tag}{i}" for i in range(n)]
        self.addrs = [f"{subnet}.{i + 1}" for i in range(n)]
        self.made = []
        self.workdir = str(workdir)
        self.agent = os.path.join(self.workdir, "netns-agent.sh")
        self.agent_log = os.path.join(self.workdir, "netns-agent.log")
        with open(os.path.join(self.workdir, "netns-hosts"), "w") as f:
            f.writelines(f"{a} {ns}\n" for a, ns in zip(self.addrs, self.names))
        with open(self.agent, "w") as f:
            f.write(textwrap.dedent(f"""\
                #!/bin/sh
                # ssh's stand-in: [options] HOST COMMAND -> COMMAND in HOST's namespace
                while [ $# -gt 0 ]; do case "$1" in -*) shift;; *) break;; esac; done
                host=$1; shift
                ns=$(awk -v h="$host" '$1 == h {{print $2}}' {self.workdir}/netns-hosts)
                [ -n "$ns" ] || {{ echo "netns-agent: unknown host $host" >&2; exit 255; }}
                echo "$host $ns" >> {self.agent_log}
                exec ip netns exec "$ns" unshare --uts sh -c "hostname $ns; $*"
                """))
        os.chmod(self.agent, 0o755)
        try:
            bridge_namespaces(self.hub, self.names, self.addrs, self.made)
        except BaseException:
            self.delete()
            raise

    def on(self, i, argv):
        """``argv`` run on host ``i``: its namespace, its own hostname."""
        return ["ip", "netns", "exec", self.names[i], "unshare", "--uts", "sh", "-c",
                'hostname "$0" && exec "$@"', self.names[i], *map(str, argv)]

    @staticmethod
    def test_env():
        """This process's environment for a job on these hosts: no ``PYFLEET_*``
        variable, the test's ``sys.path`` as ``PYTHONPATH``, one BLAS thread."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYFLEET_")}
        env.update(OPENBLAS_NUM_THREADS="1",
                   PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        return env

    def mpi_env(self, env):
        """``env`` with what mpirun needs to reach these hosts (as root)."""
        return {**env, "PRTE_MCA_plm_ssh_agent": self.agent, "OMPI_ALLOW_RUN_AS_ROOT": "1",
                "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}

    def launches(self):
        """The hosts the agent started something on, in order."""
        try:
            with open(self.agent_log) as f:
                return [line.split()[0] for line in f if line.strip()]
        except FileNotFoundError:
            return []

    def delete(self):
        for ns in reversed(self.made):
            _ip("netns", "del", ns, check=False)
        self.made = []


@contextlib.contextmanager
def mpi_hosts(n, workdir):
    """:class:`NetnsHosts` of ``n`` hosts in ``workdir``, deleted on exit; the calling
    test is skipped, with the reason, where namespaces cannot be made or there is no
    mpirun."""
    import pytest

    from pyfleet.launch.collective import find_mpiexec
    why = why_no_netns()
    if why is None and find_mpiexec() is None:
        why = "no mpirun (the mpi extra) in this installation"
    if why is not None:
        pytest.skip(why)
    h = NetnsHosts(n, workdir)
    try:
        yield h
    finally:
        h.delete()
