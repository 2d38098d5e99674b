// Test harness: an independent, OpenID-Certified OpenID Provider (panva/oidc-provider) in its own process.
//
//   node server.mjs --config CONFIG.json [--port 0] [--exit-on-stdin-close]
//
// Listens on 127.0.0.1 (port 0 = a free port) and prints ONE line to stdout once it accepts requests:
//   {"ready": true, "issuer": "http://127.0.0.1:<port>", "port": <port>}
// Everything else (oidc-provider's own notices, a line per request, errors) goes to stderr.
//
// The OP is oidc-provider as shipped, configured only through its documented options. What this file adds:
//   * GET /interaction/:uid  automatic, redirect-only login + consent (the OP's interaction API);
//   * /__admin/...           test-only controls and counters, outside the OP's own routes;
// and nothing else. See README.md in this directory for the configuration schema.

import { generateKeyPairSync, randomBytes, randomUUID } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { createServer } from 'node:http';
import { parseArgs } from 'node:util';

import { Provider, errors } from 'oidc-provider';
// The OP's own in-memory adapter class, given an unbounded store: the default instance keeps at most 1000
// entries (an LRU) and would evict sessions, grants and tokens in a long test module.
import MemoryAdapter from 'oidc-provider/lib/adapters/memory_adapter.js';

const HOST = '127.0.0.1';

const STANDARD_CLAIMS = {
  openid: ['sub'],
  email: ['email', 'email_verified'],
  profile: [
    'name', 'family_name', 'given_name', 'middle_name', 'nickname', 'preferred_username', 'profile',
    'picture', 'website', 'gender', 'birthdate', 'zoneinfo', 'locale', 'updated_at',
  ],
};

function log(message) {
  process.stderr.write(`[oidc-op] ${message}\n`);
}

function fail(message) {
  log(`fatal: ${message}`);
  process.exit(2);
}

// ---------------------------------------------------------------------------------------------- configuration

const { values: args } = parseArgs({
  options: {
    config: { type: 'string' },
    port: { type: 'string', default: '0' },
    'exit-on-stdin-close': { type: 'boolean', default: false },
  },
  strict: true,
});
if (!args.config) fail('--config CONFIG.json is required');
const port = Number(args.port);
if (!Number.isInteger(port) || port < 0 || port > 65535) fail(`--port must be 0..65535, not ${args.port}`);

let config;
try {
  config = JSON.parse(readFileSync(args.config, 'utf8'));
} catch (err) {
  fail(`cannot read ${args.config}: ${err.message}`);
}

const KNOWN_KEYS = new Set([
  'clients', 'accounts', 'login_account', 'access_token_ttl', 'refresh_token_ttl', 'refresh_token_rotation',
  'narrow_scopes', 'scopes', 'claims', 'client_auth_methods', 'par', 'loopback_fetch', 'dpop', 'fapi', 'resources',
]);
for (const key of Object.keys(config)) {
  if (!KNOWN_KEYS.has(key)) fail(`unknown configuration key ${JSON.stringify(key)}`);
}

const clients = config.clients ?? [];
if (!Array.isArray(clients) || clients.length === 0) fail('"clients" must be a non-empty list of client metadata');

const accounts = config.accounts ?? {};
if (typeof accounts !== 'object' || Array.isArray(accounts) || Object.keys(accounts).length === 0) {
  fail('"accounts" must be a non-empty map of account id -> claims');
}
for (const [id, claims] of Object.entries(accounts)) {
  if (typeof claims !== 'object' || claims === null || Array.isArray(claims)) fail(`account ${id}: claims must be an object`);
  if (claims.sub !== undefined && claims.sub !== id) {
    fail(`account ${id}: "sub" is the account id; a different "sub" claim (${claims.sub}) would be ignored`);
  }
}

function checkAccount(id, what) {
  if (typeof id !== 'string' || !Object.hasOwn(accounts, id)) fail(`${what} ${JSON.stringify(id)} is not in "accounts"`);
  return id;
}
let loginAccount = checkAccount(config.login_account ?? Object.keys(accounts)[0], '"login_account"');

function checkScopeList(value, what) {
  if (!Array.isArray(value) || !value.every((s) => typeof s === 'string' && /^[\x21\x23-\x5B\x5D-\x7E]+$/.test(s))) {
    fail(`${what} must be a list of scope tokens`);
  }
  return value;
}
let narrowScopes = new Set(checkScopeList(config.narrow_scopes ?? [], '"narrow_scopes"'));
const extraScopes = checkScopeList(config.scopes ?? ['api.read', 'api.write'], '"scopes"');

function checkTtl(value, what) {
  if (value === undefined) return undefined;
  if (!Number.isInteger(value) || value <= 0) fail(`${what} must be a positive number of seconds`);
  return value;
}
const accessTokenTtl = checkTtl(config.access_token_ttl ?? 30, '"access_token_ttl"');
const refreshTokenTtl = checkTtl(config.refresh_token_ttl, '"refresh_token_ttl"');

const rotation = config.refresh_token_rotation ?? true;
if (![true, false, 'default'].includes(rotation)) fail('"refresh_token_rotation" must be true, false or "default"');

const claims = config.claims ?? STANDARD_CLAIMS;

// oidc-provider's `clientAuthMethods`: the client authentication methods it accepts (and lists in discovery).
const clientAuthMethods = config.client_auth_methods;
if (clientAuthMethods !== undefined && (!Array.isArray(clientAuthMethods) || clientAuthMethods.length === 0)) {
  fail('"client_auth_methods" must be a non-empty list of methods');
}
// true: the OP may fetch from loopback addresses (a client's jwks_uri served by the connector under test);
// oidc-provider's SSRF protection refuses special-use addresses otherwise.
const loopbackFetch = config.loopback_fetch ?? false;
if (typeof loopbackFetch !== 'boolean') fail('"loopback_fetch" must be a boolean');
// {"require_nonce": true|false}: features.dPoP with a nonce secret, nonces required or not.
const dpop = config.dpop;
if (dpop !== undefined && (typeof dpop !== 'object' || dpop === null || typeof (dpop.require_nonce ?? false) !== 'boolean')) {
  fail('"dpop" must be an object {"require_nonce": boolean}');
}
// {"https://api.example/": "api.read api.write", ...}: features.resourceIndicators, each resource server's scopes;
// its access tokens are JWTs (ES256) with the resource as their audience.
const resources = config.resources;
if (resources !== undefined && (typeof resources !== 'object' || resources === null || Array.isArray(resources))) {
  fail('"resources" must map resource indicators to their scopes');
}
// "2.0" (or "1.0 Final"): features.fapi with that profile.
const fapi = config.fapi;
if (fapi !== undefined && !['2.0', '1.0 Final'].includes(fapi)) fail('"fapi" must be "2.0" or "1.0 Final"');
// {"required": true|false}: features.pushedAuthorizationRequests on, required of every client or not.
const par = config.par;
if (par !== undefined && (typeof par !== 'object' || par === null || typeof (par.required ?? false) !== 'boolean')) {
  fail('"par" must be an object {"required": boolean}');
}

// ------------------------------------------------------------------------------------------ test-only state

// Set through /__admin/sub-override: the next refresh_token grant (of `clientId`, or of any client) is issued
// for `sub` instead of the refresh token's account, so its ID token carries that `sub`.
let subOverride = null;
// Set through /__admin/deny-next: the next interaction ends with this error instead of login/consent.
let denyNext = null;

function emptyStats() {
  return {
    token_requests: {}, // grant_type -> token endpoint requests, whatever their outcome
    token_errors: {}, // grant_type -> { error code -> count }
    revocation_requests: 0,
    revocations: 0, // revocation requests the OP answered with 200
    introspection_requests: 0,
    authorization_requests: 0, // requests to the authorization endpoint (not the resume step)
    pushed_authorization_requests: 0, // requests to the PAR endpoint (RFC 9126), whatever their outcome
    userinfo_requests: 0,
    sub_overrides_applied: 0,
  };
}
let stats = emptyStats();

function bump(map, key) {
  map[key] = (map[key] ?? 0) + 1;
}

// ------------------------------------------------------------------------------------------------ the OP

function signingKeys() {
  const rsa = generateKeyPairSync('rsa', { modulusLength: 2048 }).privateKey.export({ format: 'jwk' });
  const ec = generateKeyPairSync('ec', { namedCurve: 'P-256' }).privateKey.export({ format: 'jwk' });
  return [
    { ...rsa, kid: `rs256-${randomUUID()}`, alg: 'RS256', use: 'sig' },
    { ...ec, kid: `es256-${randomUUID()}`, alg: 'ES256', use: 'sig' },
  ];
}

class UnboundedStore {
  #entries = new Map();

  get(key) {
    const entry = this.#entries.get(key);
    if (entry === undefined) return undefined;
    if (entry.expiresAt !== undefined && entry.expiresAt <= Date.now()) {
      this.#entries.delete(key);
      return undefined;
    }
    return entry.value;
  }

  set(key, value, options) {
    const expiresAt = typeof options?.maxAge === 'number' ? Date.now() + options.maxAge : undefined;
    this.#entries.set(key, { value, expiresAt });
  }

  delete(key) {
    this.#entries.delete(key);
  }
}

async function findAccount(ctx, id, token) {
  if (!Object.hasOwn(accounts, id)) return undefined;
  let accountId = id;
  if (
    subOverride !== null
    && token?.kind === 'RefreshToken'
    && ctx.oidc.route === 'token'
    && (subOverride.clientId === null || subOverride.clientId === ctx.oidc.client?.clientId)
  ) {
    accountId = subOverride.sub;
    subOverride = null;
    stats.sub_overrides_applied += 1;
    log(`sub-override applied: refresh of ${id} is issued for ${accountId}`);
  }
  const accountClaims = Object.hasOwn(accounts, accountId) ? accounts[accountId] : {};
  return {
    accountId,
    async claims() {
      return { ...accountClaims, sub: accountId };
    },
  };
}

function startProvider(issuer) {
  const store = new UnboundedStore();
  const provider = new Provider(issuer, {
    adapter: (model) => new MemoryAdapter(model, store),
    clients,
    claims,
    scopes: ['openid', 'offline_access', ...extraScopes],
    cookies: { keys: [randomBytes(32).toString('base64url')] },
    jwks: { keys: signingKeys() },
    findAccount,
    features: {
      devInteractions: { enabled: false }, // replaced by the automatic interactions below
      introspection: { enabled: true },
      revocation: { enabled: true },
      userinfo: { enabled: true },
      ...(dpop === undefined ? {} : {
        dPoP: { enabled: true, nonceSecret: randomBytes(32), requireNonce: () => dpop.require_nonce ?? false },
      }),
      ...(fapi === undefined ? {} : { fapi: { enabled: true, profile: fapi } }),
      ...(resources === undefined ? {} : {
        resourceIndicators: {
          enabled: true,
          defaultResource: () => undefined,
          useGrantedResource: () => true,
          getResourceServerInfo: (ctx, indicator) => {
            if (!Object.hasOwn(resources, indicator)) throw new errors.InvalidTarget();
            return {
              scope: resources[indicator], audience: indicator, accessTokenFormat: 'jwt', jwt: { sign: { alg: 'ES256' } },
            };
          },
        },
      }),
      ...(par === undefined ? {} : {
        pushedAuthorizationRequests: { enabled: true, requirePushedAuthorizationRequests: par.required ?? false },
      }),
    },
    ...(clientAuthMethods === undefined ? {} : { clientAuthMethods }),
    // The documented `fetch` option; with loopback_fetch, without the SSRF-checking dispatcher.
    fetch: (url, options) => {
      if (loopbackFetch && ['127.0.0.1', 'localhost'].includes(new URL(url).hostname)) delete options.dispatcher;
      return globalThis.fetch(url, options);
    },
    pkce: { required: () => true }, // every authorization request needs code_challenge (S256 is the only method)
    rotateRefreshToken: rotation === 'default' ? undefined : rotation,
    ttl: {
      AccessToken: accessTokenTtl,
      ...(refreshTokenTtl === undefined ? {} : { RefreshToken: refreshTokenTtl }),
    },
    // issueRefreshToken, conformIdTokenClaims, response types, the offline_access rules: oidc-provider defaults.
  });

  provider.on('server_error', (ctx, err) => log(`server_error at ${ctx.path}: ${err.stack ?? err}`));
  // Why a client was refused (oidc-provider keeps the reason out of the response): for the test's own diagnosis.
  for (const event of ['grant.error', 'revocation.error', 'pushed_authorization_request.error', 'userinfo.error']) {
    provider.on(event, (ctx, err) => log(`${event}: ${err.error} ${err.error_detail ?? err.error_description ?? ''}`));
  }

  // Counters and a request log, as an upstream Koa middleware (the documented pre/post-middleware hook).
  provider.use(async (ctx, next) => {
    await next();
    const oidc = Object.getOwnPropertyDescriptor(ctx, 'oidc') ? ctx.oidc : undefined;
    const route = oidc?.route;
    let extra = '';
    switch (route) {
      case 'token': {
        const grantType = oidc.params?.grant_type ?? ctx.request.body?.grant_type ?? 'unknown';
        bump(stats.token_requests, grantType);
        const error = ctx.status >= 400 ? ctx.body?.error ?? `http_${ctx.status}` : undefined;
        if (error !== undefined) {
          stats.token_errors[grantType] ??= {};
          bump(stats.token_errors[grantType], error);
        }
        extra = ` grant_type=${grantType}${error === undefined ? '' : ` error=${error}`}`;
        break;
      }
      case 'revocation':
        stats.revocation_requests += 1;
        if (ctx.status === 200) stats.revocations += 1;
        break;
      case 'introspection':
        stats.introspection_requests += 1;
        break;
      case 'authorization':
        stats.authorization_requests += 1;
        break;
      case 'pushed_authorization_request':
        stats.pushed_authorization_requests += 1;
        break;
      case 'userinfo':
        stats.userinfo_requests += 1;
        break;
      default:
        break;
    }
    if (ctx.status >= 400 && ctx.body?.error && route !== 'token') {
      extra = ` error=${ctx.body.error}`;
    }
    log(`${ctx.method} ${ctx.path} -> ${ctx.status}${route ? ` (${route})` : ''}${extra}`);
  });

  return provider;
}

// ------------------------------------------------------------------------------------ automatic interactions

async function interaction(provider, req, res) {
  let details;
  try {
    details = await provider.interactionDetails(req, res);
  } catch (err) {
    return sendJson(res, 400, { error: err.error ?? 'invalid_request', error_description: err.message });
  }
  const { prompt, params, session, grantId } = details;

  if (denyNext !== null) {
    const result = denyNext;
    denyNext = null;
    log(`interaction ${details.uid}: denied with ${result.error}`);
    return provider.interactionFinished(req, res, result, { mergeWithLastSubmission: false });
  }

  if (prompt.name === 'login') {
    const hint = params.login_hint;
    const accountId = typeof hint === 'string' && Object.hasOwn(accounts, hint) ? hint : loginAccount;
    log(`interaction ${details.uid}: login as ${accountId}`);
    return provider.interactionFinished(req, res, { login: { accountId } }, { mergeWithLastSubmission: false });
  }

  if (prompt.name === 'consent') {
    const grant = grantId
      ? await provider.Grant.find(grantId)
      : new provider.Grant({ accountId: session.accountId, clientId: params.client_id });
    const { missingOIDCScope = [], missingOIDCClaims = [], missingResourceScopes = {} } = prompt.details;
    const granted = missingOIDCScope.filter((s) => !narrowScopes.has(s));
    const refused = missingOIDCScope.filter((s) => narrowScopes.has(s));
    if (granted.length) grant.addOIDCScope(granted.join(' '));
    if (refused.length) grant.rejectOIDCScope(refused.join(' '));
    if (missingOIDCClaims.length) grant.addOIDCClaims(missingOIDCClaims);
    for (const [indicator, scopes] of Object.entries(missingResourceScopes)) {
      const ok = scopes.filter((s) => !narrowScopes.has(s));
      const no = scopes.filter((s) => narrowScopes.has(s));
      if (ok.length) grant.addResourceScope(indicator, ok.join(' '));
      if (no.length) grant.rejectResourceScope(indicator, no.join(' '));
    }
    const savedId = await grant.save();
    log(`interaction ${details.uid}: consent granted [${granted.join(' ')}] refused [${refused.join(' ')}]`);
    const consent = grantId ? {} : { grantId: savedId };
    return provider.interactionFinished(req, res, { consent }, { mergeWithLastSubmission: true });
  }

  return sendJson(res, 500, { error: 'server_error', error_description: `unhandled prompt ${prompt.name}` });
}

// ------------------------------------------------------------------------------------------- admin routes

function sendJson(res, status, body) {
  const data = JSON.stringify(body);
  res.writeHead(status, {
    'content-type': 'application/json; charset=utf-8',
    'content-length': Buffer.byteLength(data),
    'cache-control': 'no-store',
  });
  res.end(data);
}

async function readJson(req) {
  const chunks = [];
  let size = 0;
  for await (const chunk of req) {
    size += chunk.length;
    if (size > 65536) throw new Error('body too large');
    chunks.push(chunk);
  }
  const text = Buffer.concat(chunks).toString('utf8');
  const body = text ? JSON.parse(text) : {};
  if (typeof body !== 'object' || body === null || Array.isArray(body)) throw new Error('body must be a JSON object');
  return body;
}

const ADMIN_ROUTES = {
  'GET /__admin/stats': () => [200, stats],
  'POST /__admin/stats/reset': () => {
    stats = emptyStats();
    return [200, stats];
  },
  // {"sub": "other"} (optionally "client_id"): the next refresh is issued for that account id; {"sub": null} clears.
  'POST /__admin/sub-override': (body) => {
    if (body.sub === null) {
      subOverride = null;
    } else {
      if (typeof body.sub !== 'string' || body.sub === '') throw new Error('"sub" must be a non-empty string or null');
      if (body.client_id !== undefined && typeof body.client_id !== 'string') throw new Error('"client_id" must be a string');
      subOverride = { sub: body.sub, clientId: body.client_id ?? null };
    }
    return [200, { sub_override: subOverride }];
  },
  // {"account": "bob"}: whom the automatic login signs in from now on (a login_hint naming an account wins).
  'POST /__admin/login-account': (body) => {
    if (typeof body.account !== 'string' || !Object.hasOwn(accounts, body.account)) {
      throw new Error('"account" must name an account of the configuration');
    }
    loginAccount = body.account;
    return [200, { login_account: loginAccount }];
  },
  // {"scopes": ["api.write"]}: the scopes the automatic consent refuses from now on.
  'POST /__admin/narrow-scopes': (body) => {
    if (!Array.isArray(body.scopes) || !body.scopes.every((s) => typeof s === 'string')) {
      throw new Error('"scopes" must be a list of strings');
    }
    narrowScopes = new Set(body.scopes);
    return [200, { narrow_scopes: [...narrowScopes] }];
  },
  // {"error": "access_denied", "error_description": "..."}: the next interaction ends with that error.
  'POST /__admin/deny-next': (body) => {
    const error = body.error ?? 'access_denied';
    if (typeof error !== 'string' || !/^[\x20-\x21\x23-\x5B\x5D-\x7E]+$/.test(error)) throw new Error('bad "error"');
    denyNext = { error };
    if (body.error_description !== undefined) denyNext.error_description = String(body.error_description);
    return [200, { deny_next: denyNext }];
  },
};

async function admin(req, res, pathname) {
  const handler = ADMIN_ROUTES[`${req.method} ${pathname}`];
  if (handler === undefined) return sendJson(res, 404, { error: 'not_found', path: pathname });
  let body = {};
  try {
    if (req.method === 'POST') body = await readJson(req);
    const [status, out] = handler(body);
    log(`admin ${req.method} ${pathname} -> ${status}`);
    return sendJson(res, status, out);
  } catch (err) {
    log(`admin ${req.method} ${pathname} -> 400 ${err.message}`);
    return sendJson(res, 400, { error: 'invalid_request', error_description: err.message });
  }
}

// ----------------------------------------------------------------------------------------------- serving

let provider = null;
let opCallback = null;

const server = createServer((req, res) => {
  if (provider === null) return sendJson(res, 503, { error: 'starting' });
  const { pathname } = new URL(req.url, provider.issuer);
  if (pathname.startsWith('/__admin/')) {
    admin(req, res, pathname).catch((err) => {
      log(`admin error: ${err.stack ?? err}`);
      if (!res.headersSent) sendJson(res, 500, { error: 'server_error' });
    });
    return undefined;
  }
  if (req.method === 'GET' && /^\/interaction\/[^/]+$/.test(pathname)) {
    interaction(provider, req, res).catch((err) => {
      log(`interaction error: ${err.stack ?? err}`);
      if (!res.headersSent) sendJson(res, 500, { error: 'server_error', error_description: err.message });
    });
    return undefined;
  }
  return opCallback(req, res);
});

server.on('error', (err) => fail(`cannot listen on ${HOST}:${port}: ${err.message}`));
server.listen(port, HOST, () => {
  const actual = server.address().port;
  const issuer = `http://${HOST}:${actual}`;
  try {
    provider = startProvider(issuer);
  } catch (err) {
    fail(`oidc-provider refused the configuration: ${err.stack ?? err}`);
  }
  opCallback = provider.callback();
  process.stdout.write(`${JSON.stringify({ ready: true, issuer, port: actual })}\n`);
  log(`ready: ${issuer}`);
});

function shutdown(reason) {
  log(`stopping (${reason})`);
  server.close();
  server.closeAllConnections();
  process.exit(0);
}
process.on('SIGTERM', () => shutdown('SIGTERM'));
process.on('SIGINT', () => shutdown('SIGINT'));
if (args['exit-on-stdin-close']) {
  // The Python harness holds our stdin open; if it dies without stopping us, stdin closes and we go too.
  process.stdin.on('end', () => shutdown('stdin closed'));
  process.stdin.on('close', () => shutdown('stdin closed'));
  process.stdin.resume();
}
