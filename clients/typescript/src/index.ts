// @acp-connector/client: an ACP agent's side of the acp-connector sidecar (/v1), on the official ACP SDK.
export { SidecarApi, WAIT_SECONDS, type SidecarOptions } from "./api.js";
export { SidecarConnector, type AuthorizationRequest, type ConnectorOptions } from "./connector.js";
export { AuthorizationCancelled, ClientNotInitialized, SidecarError, SidecarUnavailableError } from "./errors.js";
export {
  events,
  verifyWebhook,
  WebhookVerificationError,
  type EventOptions,
  type StreamedEvent,
  type WebhookEnvelope,
} from "./events.js";
export { AcpLink } from "./link.js";
export { AuthorizationOutcome } from "./outcomes.js";
export { untilExpiry, type Backoff } from "./retry.js";
export type * from "./types.js";
