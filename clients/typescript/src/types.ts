// The /v1 API's bodies, as generated from its OpenAPI document (src/generated/openapi.ts, `npm run generate`).
import type { components, operations, paths } from "./generated/openapi.js";

type Schemas = components["schemas"];

export type { components, operations, paths };
export type User = Schemas["User"];
export type Scope = Schemas["Scope"];
export type CreateElicitation = Schemas["CreateElicitation"];
export type Created = Schemas["Created"];
export type ElicitationState = Schemas["ElicitationState"];
export type Grant = Schemas["Grant"];
export type GrantList = Schemas["GrantList"];
export type Answer = Schemas["Answer"];
export type Cancel = Schemas["Cancel"];
export type ElicitationEvent = Schemas["Event"];
export type AuthorizationStatus = Schemas["AuthorizationStatus"];
export type ElicitationStatus = Schemas["ElicitationStatus"];
export type ErrorBody = Schemas["Error"];
/** Why the work waiting on an elicitation stopped (`client_disconnected`: the outcome then reads `disconnected`). */
export type StopCause = NonNullable<Cancel["cause"]>;
