"""What the parameter-server Fleet and the collective Fleet share, as Fluid's
``incubate.fleet.base.fleet_base.Fleet`` is the base of both of its fleets: the role
(from a role maker, resolved once by ``init``) and the role queries, Fluid's split of
files among workers, and the program set by ``distributed_optimizer(...).minimize``.

A subclass says what its role maker must be (``_check_role_maker``) and what
``init`` does beyond recording it; the collective fleet, which has no server,
answers the server queries itself."""

from pyfleet.distributed.role_maker import RoleMakerBase
from pyfleet.errors import ConfigError

__all__ = ["FleetBase"]


class FleetBase:
    """A fleet's role and program (one fleet per process, as in Fluid)."""

    # What a role query raises before init(), for the subclass's users.
    _NO_ROLE = "call fleet.init(role_maker) first"

    def __init__(self):
        self._role = None
        self._strategy = None
        self._tables = None
        self.main_program = None
        self.startup_program = None

    # ----------------------------------------------------------------- roles
    @staticmethod
    def _check_role_maker(role_maker):
        """A role maker of :mod:`pyfleet.distributed.role_maker`, or a ConfigError."""
        if not isinstance(role_maker, RoleMakerBase):
            raise ConfigError(f"role_maker must be a pyfleet.distributed.role_maker role maker, "
                              f"got {role_maker!r}")

    def _role_maker(self):
        if self._role is None:
            raise ConfigError(self._NO_ROLE)
        return self._role

    def is_worker(self):
        return self._role_maker().is_worker()

    def is_server(self):
        return self._role_maker().is_server()

    def is_first_worker(self):
        return self._role_maker().is_first_worker()

    def worker_index(self):
        return self._role_maker().worker_index()

    def server_index(self):
        return self._role_maker().server_index()

    def worker_num(self):
        return self._role_maker().worker_num()

    def server_num(self):
        return self._role_maker().server_num()

    def server_endpoints(self, to_string=False):
        eps = self._role_maker().server_endpoints()
        return ",".join(eps) if to_string else list(eps)

    def worker_endpoints(self, to_string=False):
        """Fluid's trainer endpoints (see ``RoleMakerBase.worker_endpoints``:
        ``PADDLE_TRAINER_ENDPOINTS`` when set, else empty)."""
        eps = self._role_maker().worker_endpoints()
        return ",".join(eps) if to_string else list(eps)

    def split_files(self, files):
        """This worker's contiguous share of ``files``, in order, as Fluid splits
        them: with ``n`` files and ``w`` workers each gets ``n // w``, the first
        ``n % w`` workers one more (``[a, b, c, d, e]`` over 2 workers: ``[a, b,
        c]`` and ``[d, e]``). ValueError when there are fewer files than workers."""
        files = list(files)
        n, w, i = len(files), self.worker_num(), self.worker_index()
        if w > n:
            raise ValueError(f"split_files: {n} file(s) for {w} workers: every worker "
                             f"needs at least one file (trainer_num should be <= file_num)")
        start = i * (n // w) + min(i, n % w)
        return files[start:start + n // w + (i < n % w)]

    # ------------------------------------------------------------- programs
    def _require_program(self, what):
        if self._tables is None:
            raise ConfigError(f"{what} needs the program: call "
                              "fleet.distributed_optimizer(...).minimize(loss) first")
