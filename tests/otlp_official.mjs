// Exports two spans (a PRODUCER and its CONSUMER child, with typed attributes and statuses) to
// an OTLP/HTTP endpoint with the official OpenTelemetry JS SDK and its JSON exporter: what
// tests/otlp_traces.py's strict sink must accept, so that it is not wrong in the same way as
// rebound's own exporter.
//
//   node otlp_official.mjs NODE_TOOLS_DIR TRACES_URL
import { createRequire } from "node:module";
import path from "node:path";

const [tools, url] = process.argv.slice(2);
const require = createRequire(path.join(tools, "package.json"));
const api = require("@opentelemetry/api");
const { BasicTracerProvider, SimpleSpanProcessor } = require("@opentelemetry/sdk-trace-base");
const { OTLPTraceExporter } = require("@opentelemetry/exporter-trace-otlp-http");
const { Resource } = require("@opentelemetry/resources");

const provider = new BasicTracerProvider({ resource: new Resource({ "service.name": "official" }) });
provider.addSpanProcessor(new SimpleSpanProcessor(new OTLPTraceExporter({ url })));
const tracer = provider.getTracer("official-check", "1.0.0");

const send = tracer.startSpan("send echo", {
  kind: api.SpanKind.PRODUCER,
  attributes: { "messaging.system": "rebound", "messaging.message.id": "official-1", count: 3, ratio: 1.5, ok: true },
});
const process_ = tracer.startSpan(
  "process echo",
  { kind: api.SpanKind.CONSUMER, attributes: { "rebound.queue_wait_ms": 7 } },
  api.trace.setSpan(api.context.active(), send),
);
process_.setStatus({ code: api.SpanStatusCode.ERROR, message: "model_error" });
process_.end();
send.setStatus({ code: api.SpanStatusCode.OK });
send.end();
await provider.forceFlush();
await provider.shutdown();
console.log("official exporter: sent");
