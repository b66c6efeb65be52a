"""The parameter-server service: wire protocol, server, client, checkpoints.

One module per concept (see docs/architecture.md)::

    protocol    the frames of a message (pure functions)
    wire        fast multipart send/receive/poll helpers
    auth        CURVE keys and client authentication
    barrier     liveness, step/pass barriers and stop bookkeeping (no sockets)
    registry    the tables one server holds
    checkpoint  checkpoint directories, their manifest, a server's shard files
    table_ops   the data ops (pull, push, export) and table control ops of a server
    loop        a server's socket loop: which thread answers which request
    server      one server: dispatch, control ops, ``python -m pyfleet.service``
    channel     a client thread's sockets, its calls in flight, the pusher
    routing     keys to servers, dense blocks to servers (no sockets)
    client      the worker's Client
    geo         the Geo-SGD client

This layer imports the table layer (``pyfleet.table``, ``pyfleet.optimizer``,
``pyfleet.initializer``) and ``pyfleet.config``, never Fluid or Fleet, so a
server process does not import them. Nothing is imported here: importing
``pyfleet.service.protocol`` costs only that module.
"""
