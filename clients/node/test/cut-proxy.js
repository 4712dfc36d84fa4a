// A proxy between the tests and the server (TCP in front of the server's
// Unix socket, from the PG* environment) that can cut every connection, as
// a server restart or a network blip does.
import net from 'node:net';
import path from 'node:path';

export class CutProxy {
  constructor() {
    this.target = path.join(process.env.PGHOST, `.s.PGSQL.${process.env.PGPORT ?? 5432}`);
    this.sockets = new Set();
    this.refuse = false;
    this.cutAfter = false;   // the next statement reaches the server, then every connection is cut
    this.server = net.createServer((client) => this.accept(client));
  }

  listen() {
    return new Promise((resolve) => this.server.listen(0, '127.0.0.1', () => resolve(this.server.address().port)));
  }

  close() {
    this.cut();
    return new Promise((resolve) => this.server.close(resolve));
  }

  accept(client) {
    if (this.refuse) return client.destroy();
    const server = net.connect(this.target);
    const pair = { muted: false };   // muted: the server's answers no longer reach the client
    for (const s of [client, server]) {
      this.sockets.add(s);
      s.on('error', () => {});
      s.on('close', () => { this.sockets.delete(s); client.destroy(); server.destroy(); });
    }
    const messages = new MessageReader();
    client.on('data', (chunk) => {
      const cutNow = messages.executes(chunk) && this.cutAfter;
      if (cutNow) {
        this.cutAfter = false;
        pair.muted = true;
      }
      server.write(chunk);
      if (cutNow) setTimeout(() => this.cutFor(1000), 300);
    });
    server.on('data', (chunk) => { if (!pair.muted) client.write(chunk); });
  }

  cut() {
    for (const s of this.sockets) s.destroy();
    this.sockets.clear();
  }

  // Cuts every connection and refuses new ones for `ms`.
  cutFor(ms) {
    this.refuse = true;
    this.cut();
    setTimeout(() => { this.refuse = false; }, ms);
  }

  // The next statement a client runs reaches the server, then every
  // connection is cut (for 1 s) before its answer comes back.
  cutAfterNextStatement() {
    this.cutAfter = true;
  }
}

// Follows the messages a client sends (the startup message, then a type
// byte and a length each) to tell when one has a statement run and
// committed: a whole Query, or the Sync after an Execute.
class MessageReader {
  constructor() {
    Object.assign(this, { started: false, header: [], left: 0, query: false, executed: false });
  }

  executes(chunk) {
    let runs = false;
    let at = 0;
    while (at < chunk.length) {
      if (this.left > 0) {
        const n = Math.min(this.left, chunk.length - at);
        this.left -= n;
        at += n;
        if (this.left === 0 && this.query) {
          runs = true;
          this.query = false;
        }
        continue;
      }
      const size = this.started ? 5 : 4;
      while (this.header.length < size && at < chunk.length) this.header.push(chunk[at++]);
      if (this.header.length < size) break;
      const h = this.header;
      const length = ((h[size - 4] << 24) | (h[size - 3] << 16) | (h[size - 2] << 8) | h[size - 1]) >>> 0;
      if (this.started) {
        const type = String.fromCharCode(h[0]);
        if (type === 'Q') this.query = true;
        if (type === 'E') this.executed = true;
        if (type === 'S') {
          runs = runs || this.executed;
          this.executed = false;
        }
      }
      this.left = length - 4;
      this.started = true;
      this.header = [];
    }
    return runs;
  }
}
