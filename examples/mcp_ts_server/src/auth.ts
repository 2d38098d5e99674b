// MCP's own authorization on streamable HTTP, the resource server's side: a request counts only with a JWT access
// token (RFC 9068) signed by a key in the authorization server's JWKS (a URL or a file), whose `iss`, `aud` (this
// server's URL), `exp` and `sub` check out. Its `(iss, sub)` is the user the connector binds the elicitation to; the
// connect page checks the person in the browser against it.

import { readFile } from "node:fs/promises";
import type { AuthInfo } from "@modelcontextprotocol/sdk/server/auth/types.js";
import { createLocalJWKSet, createRemoteJWKSet, jwtVerify, type JWTVerifyGetKey } from "jose";
import type { User } from "@acp-connector/client/mcp";

export class JwtVerifier {
  private keys: Promise<JWTVerifyGetKey> | undefined;

  constructor(
    readonly issuer: string,
    readonly audience: string,
    private readonly jwks: string,
  ) {}

  private keySet(): Promise<JWTVerifyGetKey> {
    this.keys ??= /^https?:\/\//.test(this.jwks)
      ? Promise.resolve(createRemoteJWKSet(new URL(this.jwks)))
      : readFile(this.jwks, "utf8").then((text) => createLocalJWKSet(JSON.parse(text)));
    return this.keys;
  }

  /** The verified token's `AuthInfo` (the user in `extra`), or undefined: answer 401. */
  async verify(authorization: string | undefined): Promise<AuthInfo | undefined> {
    const token = /^Bearer (\S+)$/i.exec(authorization ?? "")?.[1];
    if (token === undefined) return undefined;
    try {
      const { payload } = await jwtVerify(token, await this.keySet(), {
        issuer: this.issuer,
        audience: this.audience,
        algorithms: ["RS256", "ES256"],
        requiredClaims: ["sub", "exp"],
      });
      const user: User = { issuer: String(payload.iss), subject: String(payload.sub) };
      return {
        token,
        clientId: String(payload.client_id ?? ""),
        scopes: String(payload.scope ?? "").split(" ").filter(Boolean),
        expiresAt: payload.exp,
        resource: new URL(this.audience),
        extra: { user },
      };
    } catch {
      return undefined;
    }
  }
}

/** The user a verified `AuthInfo` names. */
export function userOf(auth: AuthInfo | undefined): User {
  const user = auth?.extra?.user as User | undefined;
  if (user === undefined) throw new Error("no verified user on this request");
  return user;
}
