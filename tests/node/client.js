// A grpcgrade client made from proto/ alone (no generated code, no grpcgrade package): grades one agent
// sample over gRPC and prints the response as JSON. Usage: node client.js PROTO_DIR TARGET SAMPLE_JSON GRADERS_JSON
"use strict";
const grpc = require("@grpc/grpc-js");
const protoLoader = require("@grpc/proto-loader");

const [protoDir, target, sampleJson, gradersJson] = process.argv.slice(2);

// google.protobuf.Value as proto-loader encodes it (one field of its `kind` oneof set).
function toValue(v) {
  if (v === null) return { nullValue: "NULL_VALUE" };
  if (Array.isArray(v)) return { listValue: toList(v) };
  if (typeof v === "object") return { structValue: toStruct(v) };
  if (typeof v === "number") return { numberValue: v };
  if (typeof v === "boolean") return { boolValue: v };
  return { stringValue: String(v) };
}
const toList = (items) => ({ values: items.map(toValue) });
const toStruct = (obj) => ({ fields: Object.fromEntries(Object.entries(obj).map(([k, v]) => [k, toValue(v)])) });

const definition = protoLoader.loadSync("grpcgrade/v1/grading.proto", {
  includeDirs: [protoDir],
  keepCase: true,
  defaults: false,
  oneofs: true,
});
const v1 = grpc.loadPackageDefinition(definition).grpcgrade.v1;
const client = new v1.GradingService(target, grpc.credentials.createInsecure());

const raw = JSON.parse(sampleJson);
const sample = {};
for (const [key, value] of Object.entries(raw)) {
  if (["messages", "tool_calls", "tool_definitions"].includes(key)) sample[key] = toList(value);
  else if (key === "extra") sample.extra = toStruct(value);
  else sample[key] = value;
}
const graders = JSON.parse(gradersJson).map((g) => ({ name: g.name, params: toStruct(g.params || {}) }));

client.Evaluate({ graders, sample }, { deadline: Date.now() + 60000 }, (err, reply) => {
  if (err) {
    console.error(`${err.code} ${err.details}`);
    process.exit(1);
  }
  const results = reply.results.map((r) => ({
    key: r.key,
    score: r.score,
    reason: r.reason,
    error: r.error ? { code: r.error.code, message: r.error.message } : null,
  }));
  console.log(JSON.stringify({ id: reply.id, results }));
  client.close();
});
