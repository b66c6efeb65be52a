"""Fleet over pyfleet's service: :mod:`pyfleet.distributed.fleet` (the public
``fleet`` singleton, roles, programs, checkpoints) and
:mod:`pyfleet.distributed.remote_backend` (the executor's parameters on the servers)."""
