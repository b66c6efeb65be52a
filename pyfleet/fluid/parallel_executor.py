"""Fluid's ``fluid.ParallelExecutor`` on CPU: one program run by an :class:`Executor`
through ``CompiledProgram(program).with_data_parallel(...)``, which is what a
pyfleet process is (one CPU place; more throughput comes from more workers).

``ParallelExecutor(use_cuda, loss_name=None, main_program=None, share_vars_from=None,
exec_strategy=None, build_strategy=None, num_trainers=1, trainer_id=0, scope=None)``:

- ``use_cuda=True`` is refused by name (pyfleet trains on CPUs), and so are
  ``num_trainers > 1`` (Fluid's NCCL multi-trainer all-reduce; pyfleet's collective
  mode all-reduces among MPI ranks: docs/collective.md) and a feed given per device
  (a list of several dicts);
- ``share_vars_from`` (another ParallelExecutor) shares its parameters, which every
  executor of a pyfleet process does already (one scope); anything else is a TypeError;
- ``run(fetch_list, feed=None, feed_dict=None, return_numpy=True)`` is one
  ``Executor.run`` step of the program (``feed_dict``: Fluid's old name of ``feed``);
- ``device_count`` is 1; ``drop_local_exe_scopes()`` has nothing to drop.
"""

from pyfleet.errors import UnsupportedError
from pyfleet.fluid.compiler import CompiledProgram
from pyfleet.fluid.executor import Executor
from pyfleet.fluid.framework import default_main_program
from pyfleet.fluid.tensor import CPUPlace

__all__ = ["ParallelExecutor"]


class ParallelExecutor:
    def __init__(self, use_cuda, loss_name=None, main_program=None, share_vars_from=None,
                 exec_strategy=None, build_strategy=None, num_trainers=1, trainer_id=0,
                 scope=None):
        if use_cuda:
            raise UnsupportedError("fluid.ParallelExecutor(use_cuda=True) is not supported by "
                                   "pyfleet: it trains on CPUs (use_cuda=False)")
        if num_trainers != 1 or trainer_id != 0:
            raise UnsupportedError(
                f"fluid.ParallelExecutor(num_trainers={num_trainers}, trainer_id="
                f"{trainer_id}) is not supported by pyfleet: Fluid's NCCL all-reduce among "
                f"trainers; pyfleet's collective mode all-reduces among MPI ranks "
                f"(docs/collective.md)")
        if share_vars_from is not None and not isinstance(share_vars_from, ParallelExecutor):
            raise TypeError(f"share_vars_from must be a ParallelExecutor, got "
                            f"{share_vars_from!r}")
        self._program = main_program if main_program is not None else default_main_program()
        self._compiled = CompiledProgram(self._program).with_data_parallel(
            loss_name=loss_name, build_strategy=build_strategy, exec_strategy=exec_strategy)
        self._executor = Executor(CPUPlace())
        self._scope = scope

    @property
    def device_count(self):
        return 1

    def run(self, fetch_list, feed=None, feed_dict=None, return_numpy=True):
        if feed is None:
            feed = feed_dict
        if isinstance(feed, (list, tuple)):
            if len(feed) != 1:
                raise UnsupportedError(
                    f"fluid.ParallelExecutor.run with a feed per device ({len(feed)} dicts) is "
                    f"not supported by pyfleet: one CPU place per process; feed one dict")
            feed = feed[0]
        return self._executor.run(self._compiled, feed=feed, fetch_list=fetch_list,
                                  scope=self._scope, return_numpy=return_numpy)

    def drop_local_exe_scopes(self):
        """Fluid frees its per-device scopes here; a pyfleet process has none."""
