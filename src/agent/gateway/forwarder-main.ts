// The model forwarder: runs INSIDE the sandbox from the runtime generation (bundled into one file) and
// gives any agent a model at a loopback address although the sandbox has no network. It listens on
// 127.0.0.1:<port>, relays every connection byte for byte to the episode's model proxy socket
// (bind-mounted into the sandbox), then starts the agent's command with `sh -c` and ends as it ends.
// It holds no secret: the proxy adds the API key outside the sandbox.
//
//   ROLLOUT_AGENT_COMMAND=<command> node model-forwarder.mjs <proxy-socket> <port>
// (The command travels in the environment, as it came: quoted into an argument it could grow past
// the kernel's 128 KiB limit of one argument.)
import { spawn } from 'node:child_process';
import net from 'node:net';
import { constants } from 'node:os';

const [socketPath, portText] = process.argv.slice(2);
const port = Number(portText);
const command = process.env.ROLLOUT_AGENT_COMMAND;
delete process.env.ROLLOUT_AGENT_COMMAND;
if (socketPath === undefined || command === undefined || !Number.isInteger(port) || port < 1 || port > 65_535) {
  process.stderr.write('usage: ROLLOUT_AGENT_COMMAND=<command> model-forwarder <proxy-socket> <port 1-65535>\n');
  process.exit(2);
}

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
server.listen(port, '127.0.0.1', () => {
  const child = spawn('/bin/sh', ['-c', command], { stdio: 'inherit' });
  for (const signal of ['SIGTERM', 'SIGINT', 'SIGHUP'] as const) process.on(signal, () => child.kill(signal));
  child.on('error', (err) => {
    process.stderr.write(`model forwarder: cannot start the agent: ${err.message}\n`);
    process.exit(127);
  });
  // As a shell reports it: the child's exit code, or 128 + the signal that ended it.
  child.on('exit', (code, signal) => process.exit(code ?? 128 + (signal !== null ? constants.signals[signal] : 0)));
});
