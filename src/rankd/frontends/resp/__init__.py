"""The Redis-protocol (RESP) front-end (issue 27): Redis clients in any
language talk to rankd's boards as sorted sets.

Its modules depend one way, each only on those below it
(``tests/test_architecture.py`` checks that no circle comes back):

* ``connection``: the listener and the connection's state machine (read,
  queue, admit, batch, answer); it imports the table;
* ``commands``: the command table, assembled from the command modules,
  with the connection and introspection commands (``HELLO``, ``CLIENT``,
  ``COMMAND``...);
* the command modules: ``transactions`` (MULTI/EXEC, over
  ``aggregates``), ``aggregates``, ``pops``, ``pop_runs``, ``expiry``,
  ``tooling``, ``monitor``, ``categories``, over ``sorted_sets``; each
  handler is given a ``context.Context``, never the connection;
* what they share: ``context`` (the handler's view of its connection, the
  table's entry type, what a handler returns), ``exec_step`` (the engine
  an ``EXEC``'s commands see), ``lex`` (the lex-range walk), ``blocking``,
  ``limits``, ``arguments``, ``glob``;
* the wire: ``protocol`` (requests and replies, natively ``_scanner``),
  ``doubles``, ``info``.
"""
