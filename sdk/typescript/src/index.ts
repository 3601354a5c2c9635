/** @sandgate/sdk: the client of sandgate's `/v1` API, its typed errors and retry rule. */
export * from "./errors.js";
export * from "./retry.js";
export * from "./models.js";
export * from "./client.js";
export type * from "./schema.js";
