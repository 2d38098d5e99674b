// A real EventSource client (the npm `eventsource` package, which follows the WHATWG reconnection rules) on the
// connector's /v1/events. Usage: node sse_client.mjs URL API_KEY
// stdout, one JSON object a line: {"open":true} at each (re)connection, {"ready":ID} for the stream's opening, {"id":..,"data":..} for each event,
// {"error":..} when the connection drops. It never exits by itself: the test ends it.
import { EventSource } from "eventsource";

const [url, key] = process.argv.slice(2);
const say = (value) => process.stdout.write(JSON.stringify(value) + "\n");
const source = new EventSource(url, {
  fetch: (input, init) =>
    fetch(input, { ...init, headers: { ...init.headers, Authorization: `Bearer ${key}` } }),
});
source.addEventListener("open", () => say({ open: true }));
source.addEventListener("ready", (event) => say({ ready: event.lastEventId }));
source.addEventListener("elicitation", (event) => say({ id: event.lastEventId, data: JSON.parse(event.data) }));
source.addEventListener("error", (event) => say({ error: String(event.message ?? event.code ?? "closed") }));
process.stdin.on("close", () => process.exit(0));
process.stdin.resume();
