"""hacfed's lab side (installed as ``hacfed.clients``): everything a lab's processes run.

Never imports ``hacfed.server`` (tests/unit/test_import_boundary.py). Processes and the modules each
one runs:

- hacfed-client (``main``, ``config``, ``runner``): checks the config, creates the lab's key, loads
  the model and keeps it resident in a ``participant`` (its round ``step``; ``rollout_and_eval``,
  ``training`` with the HACPO ``update``, ``checkpoints``), serves it on a private Unix socket through the
  participant ``service`` behind the relay's local gRPC (``relay``), and supervises the lab's Flower
  SuperNode (``supernode``);
- the SuperNode (``supernode``, run as ``python -m hacfed.clients.supernode``);
- a fresh ``flwr-clientapp`` process per message, started by the SuperNode (``clientapp`` +
  ``relay``): a torch-free relay of the coordinator's bytes to the resident participant.

The exchange itself is described in ``hacfed.server``'s docstring; ``hacfed sim`` runs the same
participant in one process with the coordinator.
"""
