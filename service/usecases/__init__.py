"""What the routes do, one module per operation family: ``search``, ``items`` (add and
delete), ``galleries``, ``models`` (register, promote, roll back), ``jobs`` (submit, list,
cancel). Every route calls one of these and nothing else; they call the runtime and the
state layer and raise typed errors (``service.state.errors``), never HTTP ones.
"""
