"""hacfed's coordinator side (installed as ``hacfed.server``): everything the coordinator's processes run.

Never imports torch (docs/design.md; tests/unit/test_import_boundary.py and test_serverapp_process.py check
it) and never imports ``hacfed.clients``. Processes and the modules each one runs:

- hacfed-server (``main``, ``config``, ``runner``): checks the config, opens the journal, creates
  the coordinator key, supervises the Flower SuperLink and submits the app run (``superlink``);
- the Flower ServerApp, started by the SuperLink for that run (``serverapp``, app files in
  ``flower_app/``): its round loop hands every exchange to the round driver (``driver``), which
  owns the ``coordinator`` core (plans, validation, journal, round state machine), the key registry
  (``membership``), the console and metrics formats (``reporting``) and the settings hacfed-server
  wrote for it (``driver_settings``).

    hacfed-server --config deploy/coordinator.toml --insecure --listen 127.0.0.1:9092
    hacfed-client --model tiny-llama --server 127.0.0.1:9092 --participant-id lab-a \\
        --state-dir state/lab-a --coordinator-key state/coordinator/coordinator.pub --insecure

Protocol (one exchange per round, docs/design.md), every payload an Ed25519 envelope (security.md S2):

    coordinator (FederationDriver, inside the Flower ServerApp)          participant (ParticipantService)
    update = coordinator.engine.round_update(r)
    seal(encode_round_update(update), ROUND_UPDATE, coordinator key, DOMAIN_UPDATE) ──► open with the
                                                                     coordinator's public key, decode,
                                                                     check the plan against the local task,
                                                                     Participant.step(update) (cached per
                                                                     (run, pool round, plan round)),
    open with <keys-dir>/<id>.pub, signer == hello id ◄──────────── seal(encode_submission(sub), SUBMISSION,
    coordinator.submit(sub, sender=signer)                           participant key, DOMAIN_SUBMIT)

After the last round a plan-less update goes out; the answers are the final reports
(`Coordinator.record_final_report`). Errors on the participant side travel back as gRPC statuses
with `HACFED-E-...` codes through the relay; the driver logs them and the round goes on without
that participant (deadline and quorum, security.md T10).

Once the coordinator has recorded a participant's final report (or the participant is quarantined),
it sends a signed final acknowledgement: only then may the participant leave (hacfed-client exits
then, unless `--stay`).
The lab's side of the exchange is ``hacfed.clients``; what both sides share (wire, envelope, key
files and payload types, Flower record keys) is in ``hacfed``.
"""
