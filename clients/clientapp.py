"""hacfed's Flower ClientApp: a stateless, torch-free relay to the resident participant.

Runs on a lab's side, in the lab's SuperNode process: hacfed's resident ClientApp runner
(`hacfed.clients.clientapp_runner`) calls it for every message. It keeps no state and imports nothing
heavy, which is what makes that safe, and also lets stock Flower run it in a fresh `flwr-clientapp`
process per message (`HACFED_CLIENTAPP_ISOLATION=subprocess`, `hacfed.clients.supernode`).

Message types (sent by the coordinator's `hacfed.server.serverapp`):
- `query.hello`: names the participant (the SuperNode's node config `participant-id`) and
  relays the coordinator's challenge to the participant, whose signed answer proves the node
  speaks for that registered participant (`hacfed.hello`); lets the ServerApp map Flower node
  ids to participants.
- `train.exchange`: `content["hacfed"]["payload"]` (bytes) is forwarded to the participant's
  `/hacfed.v1.ParticipantRelay/Exchange`; the reply bytes come back the same way.
Every reply also says which participant answered and whether torch was loaded here.
"""

from __future__ import annotations

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from hacfed.clients.relay import hello_content, relay_content

HELLO_ACTION = "hello"
EXCHANGE_ACTION = "exchange"

# A plain assignment: flwr's app loader finds `app` by parsing the module (no annotations).
app = ClientApp()


@app.query(HELLO_ACTION)
def hello(msg: Message, context: Context) -> Message:
    return Message(hello_content(msg.content, context.node_config, context.run_config), reply_to=msg)


@app.train(EXCHANGE_ACTION)
def exchange(msg: Message, context: Context) -> Message:
    return Message(relay_content(msg.content, context.node_config, context.run_config), reply_to=msg)
