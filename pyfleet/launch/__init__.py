"""Start every role of a parameter-server job as local processes.

Command line (also installed as ``fleetrun``)::

    fleetrun --server_num 2 --worker_num 2 [--servers h:p,h:p] [--workers h:p,h:p]
        [--log_dir DIR] [--mode sync|async|geo|hybrid] [--grace 30] [--timeout SECONDS]
        [--stop-timeout 5] [--max-restarts N [--restart-window 3600] [--restore-dir DIR]]
        [--paddle] train.py [script arguments...]
    python -m pyfleet.launch --collective --workers N [--hosts h1,h2 | --hostfile F]
        [--timeout SECONDS] train.py [script arguments...]

``--mode hybrid`` starts the servers as usual and the workers as one MPI job (``mpiexec``, one
supervised role ``workers``; each worker's index is its rank). ``--collective`` starts a
collective (all-reduce) job instead: ``N`` MPI ranks through
``mpiexec`` (see :func:`launch_collective` and docs/collective.md), no server.

``--paddle`` runs the script unchanged: ``import paddle`` is pyfleet in every role and in
every Python process a role starts (:mod:`pyfleet.as_paddle`).

(Paddle's fleetrun flags; ``--servers 2 --workers 2``, plain numbers, are counts.)

Each role gets the environment contract of ``docs/fleet.md``: pyfleet's variables
(``PYFLEET_ROLE``, ``PYFLEET_SERVER_ENDPOINTS``, ...) and the PaddleCloud ones
(``TRAINING_ROLE``, ``PADDLE_PSERVERS_IP_PORT_LIST``, ...), so both ``fleet.init()`` with no
argument and ``PaddleCloudRoleMaker()`` work. Without ``--server-endpoints``, servers get free
ports on 127.0.0.1.

Supervision rules (the same from Python through :func:`launch_local`):

- every line a role prints (stdout and stderr, merged) is echoed with a prefix such as
  ``[server.0] `` or ``[worker.1] ``, and copied unprefixed to ``DIR/<role>.<i>.log`` when a
  log directory is given;
- a role exiting non-zero (or killed by a signal) stops every other role; the launcher names
  the role and its exit code and exits non-zero (with that code when it is in 1..255);
- once every worker has exited 0, servers get ``grace`` seconds to exit by themselves (they
  do after every worker called ``fleet.stop_worker()``); servers still running then are
  terminated and reported, and the job still counts as a success;
- past ``timeout`` seconds everything is stopped and the exit code is 124;
- SIGINT, SIGTERM or SIGHUP to the launcher stops every role (exit code 128 + signal);
- with ``--max-restarts N`` a role's death instead stops every role and starts the whole
  job again (same endpoints), at most N times within ``--restart-window`` seconds; then the
  job fails with one line per death (:mod:`pyfleet.launch.restart`). Across ``--hosts``
  the whole mpirun job restarts, on the next block of ports (:mod:`pyfleet.launch.hosts`).

Each role runs in its own session (process group), and "stop" means SIGTERM to the whole
group, then SIGKILL after ``stop_timeout`` seconds (default 5), so helper processes a role
started are stopped too.
On Linux each role also gets SIGTERM if the launcher dies without cleaning up (PDEATHSIG).

One module per concept: ``contract`` (the roles' environment, free ports), ``local`` (the
supervised local processes), ``restart`` (``--max-restarts``), ``collective`` (mpiexec),
``hosts`` (a job across hosts), ``mpirun`` (an mpirun job watched: which rank ended it),
``command`` (the command line).
"""

from pyfleet.launch.collective import launch_collective
from pyfleet.launch.command import HelpFormatter, main
from pyfleet.launch.contract import CONTRACT_VARS, EXIT_TIMEOUT, free_ports, role_env
from pyfleet.launch.local import launch_local

__all__ = ["CONTRACT_VARS", "EXIT_TIMEOUT", "HelpFormatter", "free_ports", "launch_collective",
           "launch_local", "main", "role_env"]
