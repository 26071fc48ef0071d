// The model forwarder: runs INSIDE the sandbox from the runtime generation (bundled into one file) and
// gives any agent a model at a loopback address although the sandbox has no network. It listens on
// 127.0.0.1:<port>, prints one line once it does (the worker then starts the agent), and relays every
// connection byte for byte to the episode's model proxy socket (bind-mounted into the sandbox). It is
// not the agent's parent: an agent that kills it loses its model, never its own exit code. It holds
// no secret: the proxy adds the API key outside the sandbox.
//
//   node model-forwarder.mjs <proxy-socket> <port>
import net from 'node:net';

const [socketPath, portText] = process.argv.slice(2);
const port = Number(portText);
if (socketPath === undefined || !Number.isInteger(port) || port < 1 || port > 65_535) {
  process.stderr.write('usage: model-forwarder <proxy-socket> <port 1-65535>\n');
  process.exit(2);
}
// The worker stops reading once the forwarder is ready: later writes must not kill it.
process.stdout.on('error', () => undefined);
process.stderr.on('error', () => undefined);

const server = net.createServer((client) => {
  client.setNoDelay(true);
  const proxy = net.connect(socketPath);
  // Either side ending or failing ends both, so a client that goes away reaches the proxy (which then
  // aborts the upstream call) and a proxy that closes reaches the client.
  const end = () => {
    client.destroy();
    proxy.destroy();
  };
  client.on('error', end).on('close', end);
  proxy.on('error', end).on('close', end);
  client.pipe(proxy);
  proxy.pipe(client);
});
server.on('error', (err) => {
  process.stderr.write(`model forwarder: cannot listen on 127.0.0.1:${port}: ${err.message}\n`);
  process.exit(70);
});
server.listen(port, '127.0.0.1', () => process.stdout.write(`listening on 127.0.0.1:${port}\n`));
