// A sidecar for the package's own tests: the /v1 calls the connector makes, in memory, on a loopback port that can
// be closed and opened again (a restart). The Python test suite runs the package against the real sidecar.
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";

export type Elicitation = {
  elicitationId: string;
  status: string;
  outcome: string | null;
  reason: string | null;
  answers: unknown[];
  cancels: unknown[];
  expiresAt: string;
};

export class FakeSidecar {
  readonly elicitations = new Map<string, Elicitation>();
  /** The bodies of `POST /v1/elicitations`, as sent. */
  readonly created: Array<Record<string, unknown>> = [];
  ttlMs = 60_000;
  private server: Server | undefined;
  private port = 0;
  private waiters = new Set<() => void>();

  get baseUrl(): string {
    return `http://127.0.0.1:${this.port}`;
  }

  async start(): Promise<void> {
    const server = createServer((request, response) => {
      this.handle(request, response).catch((error: unknown) => {
        response.writeHead(500).end(String(error));
      });
    });
    await new Promise<void>((resolve) => server.listen(this.port, "127.0.0.1", resolve));
    this.port = (server.address() as AddressInfo).port;
    this.server = server;
  }

  /** Stop answering at once: open connections (a long-poll) are dropped, as when the process is killed. */
  async kill(): Promise<void> {
    const server = this.server;
    this.server = undefined;
    if (server === undefined) return;
    server.closeAllConnections();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  }

  /** End an elicitation as the browser's callback would. */
  complete(elicitationId: string): void {
    this.end(elicitationId, "completed", "authorized", null);
  }

  only(): Elicitation {
    const [one, ...others] = [...this.elicitations.values()];
    if (one === undefined || others.length > 0)
      throw new Error(`expected one elicitation, have ${this.elicitations.size}`);
    return one;
  }

  private end(id: string, status: string, outcome: string, reason: string | null): boolean {
    const found = this.elicitations.get(id);
    if (found === undefined || found.outcome !== null) return false;
    Object.assign(found, { status, outcome, reason });
    for (const wake of this.waiters) wake();
    return true;
  }

  private state(found: Elicitation): Record<string, unknown> {
    return {
      elicitationId: found.elicitationId,
      status: found.status,
      outcome: found.outcome,
      reason: found.reason,
      provider: "demo",
      providerDisplayName: "Demo",
      grant: null,
      refusedScopes: [],
      expiresAt: found.expiresAt,
    };
  }

  private async handle(request: IncomingMessage, response: ServerResponse): Promise<void> {
    const url = new URL(request.url ?? "/", this.baseUrl);
    const chunks: Buffer[] = [];
    for await (const chunk of request) chunks.push(chunk as Buffer);
    const body = chunks.length > 0 ? (JSON.parse(Buffer.concat(chunks).toString()) as Record<string, unknown>) : {};
    const send = (status: number, payload: unknown): void => {
      response.writeHead(status, { "Content-Type": "application/json" }).end(JSON.stringify(payload));
    };
    const match = /^\/v1\/elicitations(?:\/([^/]+))?(?:\/(answer|cancel))?$/.exec(url.pathname);
    if (match === null) return send(404, { error: { code: "not_found", message: "No such route." } });
    const [, id, action] = match;
    if (id === undefined) {
      this.created.push(body);
      if (body.grantsOnly === true) return send(200, { status: "needs_user", providerDisplayName: "Demo" });
      if (body.urlMode === false) return send(200, { status: "unsupported", providerDisplayName: "Demo" });
      const elicitationId = `e${this.elicitations.size + 1}`;
      const expiresAt = new Date(Date.now() + this.ttlMs).toISOString();
      const found = {
        elicitationId,
        status: "pending",
        outcome: null,
        reason: null,
        answers: [],
        cancels: [],
        expiresAt,
      };
      this.elicitations.set(elicitationId, found);
      return send(201, {
        status: "created",
        providerDisplayName: "Demo",
        elicitationId,
        url: `${this.baseUrl}/connect/${elicitationId}`,
        message: "Sign in to Demo",
        expiresAt,
      });
    }
    const found = this.elicitations.get(id);
    if (found === undefined) return send(404, { error: { code: "unknown_elicitation", message: "No such one." } });
    if (action === "answer") {
      if (found.answers.length > 0) return send(409, { error: { code: "already_answered", message: "Answered." } });
      found.answers.push(body);
      if (body.action === "accept") found.status = "consented";
      else if (body.action === "cancel" && typeof body.message === "string") {
        this.end(id, "cancelled", "refused", `client_refused: ${body.message}`);
      } else if (body.action === "cancel") this.end(id, "cancelled", "cancelled", "dismissed in the client");
      else if (body.action === "decline") this.end(id, "declined", "declined", "declined in the client");
      else this.end(id, "failed", "client_error", "client error");
      return send(200, this.state(found));
    }
    if (action === "cancel") {
      found.cancels.push(body);
      if (!this.end(id, "cancelled", "cancelled", String(body.cause))) {
        return send(409, { error: { code: "already_ended", message: "It has ended." } });
      }
      return send(200, this.state(found));
    }
    const wait = Number(url.searchParams.get("wait") ?? "0");
    if (found.outcome === null && wait > 0) {
      await new Promise<void>((resolve) => {
        const wake = (): void => {
          this.waiters.delete(wake);
          clearTimeout(timer);
          resolve();
        };
        const timer = setTimeout(wake, wait * 1000);
        this.waiters.add(wake);
        request.socket.once("close", wake);
      });
    }
    return send(200, this.state(found));
  }
}
