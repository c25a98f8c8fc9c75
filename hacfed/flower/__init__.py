"""hacfed over the Flower deployment engine (flwr 1.32): processes, ServerApp, ClientApp relay.

Modules: `launch` starts the SuperLink / SuperNodes and submits the app, `serverapp` drives
rounds through a pluggable `RoundDriver`, `clientapp` + `relay` forward bytes from each
SuperNode to its resident participant over local gRPC, `app/pyproject.toml` is the app.

The exact commands `hacfed.flower.launch` runs (each with its own FLWR_HOME,
FLWR_TELEMETRY_ENABLED=0, FLWR_DISABLE_UPDATE_CHECK=1,
FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1, this venv's bin first on PATH, in its own
process group; ports are examples: port 0 lets the OS choose, and `launch` reads the bound
ports back from the logs, "Starting {Control,ServerAppIo,Fleet} API ... on HOST:PORT"):

    flower-superlink --fleet-api-type grpc-rere --fleet-api-address 127.0.0.1:9092 \\
        --control-api-address 127.0.0.1:9093 --serverappio-api-address 127.0.0.1:9091 \\
        --database STATE/superlink.db --disable-runtime-dependency-installation --insecure
    # with TLS instead of --insecure:
    #   --ssl-certfile server.pem --ssl-keyfile server.key --ssl-ca-certfile ca.pem

    python -m hacfed.flower.launch fast-poll-supernode 0.5 \\
        --grpc-rere --superlink 127.0.0.1:9092 --clientappio-api-address 127.0.0.1:0 \\
        --node-config NODE/node-config.toml --insecure      # or --root-certificates ca.pem
    # node-config.toml:  participant-id = "lab-a"
    #                    participant-address = "127.0.0.1:50051"
    # (`idle_poll_s=None` runs the stock `flower-supernode` with the same arguments)

    flwr run <hacfed/flower/app> hacfed --run-config CLI/run-config.toml --stream
    # CLI/flwr-home/config.toml:
    #   [superlink]
    #   default = "hacfed"
    #   [superlink.hacfed]
    #   address = "127.0.0.1:9093"
    #   insecure = true          # or: insecure = false, root-certificates = "/abs/ca.pem"
    # run-config.toml sets driver = "pkg.mod:factory" and any key of [tool.flwr.app.config]

    flwr ls hacfed --run-id RUN_ID --format json     # -> "finished:completed" | "finished:failed"
    flwr log RUN_ID hacfed --show                    # the ServerApp's output (or --stream)

`flwr run --stream` prints "Successfully started run <id>", then the ServerApp's stdout and
stderr, and exits when the run ends. The participant side serves
`hacfed.flower.relay.serve_participant(handler)` on 127.0.0.1 before its SuperNode starts.

Measured on 2 busy CPU cores, 2 SuperNodes, tiny payloads: one round trip takes ~5.0 s
(median) with stock Flower and ~2.1-2.6 s with the 0.5 s SuperNode poll; what remains is the
SuperNode's superexec (polls every 1 s) starting a fresh `flwr-clientapp` process per message.
"""
