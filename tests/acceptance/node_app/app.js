// A RAG service written in JavaScript, traced with the OpenTelemetry JS SDK using the GenAI
// semantic conventions, exporting OTLP/HTTP JSON to the URL given as the first argument.
// The questions, documents and answers come as JSON on the second argument.
"use strict";
const { NodeTracerProvider } = require("@opentelemetry/sdk-trace-node");
const { SimpleSpanProcessor } = require("@opentelemetry/sdk-trace-base");
const { OTLPTraceExporter } = require("@opentelemetry/exporter-trace-otlp-http");
const { resourceFromAttributes } = require("@opentelemetry/resources");
const api = require("@opentelemetry/api");

const [url, scenarioJson] = process.argv.slice(2);
const scenario = JSON.parse(scenarioJson);
const provider = new NodeTracerProvider({
  resource: resourceFromAttributes({ "service.name": "node-rag" }),
  spanProcessors: [new SimpleSpanProcessor(new OTLPTraceExporter({ url }))],
});
provider.register();
const tracer = api.trace.getTracer("node-rag");

function answer(request) {
  return tracer.startActiveSpan("invoke_agent support", (agent) => {
    agent.setAttribute("gen_ai.operation.name", "invoke_agent");
    agent.setAttribute("gen_ai.agent.name", "support");
    agent.setAttribute(
      "gen_ai.input.messages",
      JSON.stringify([{ role: "user", parts: [{ type: "text", content: request.question }] }]),
    );
    tracer.startActiveSpan("retrieval kb", (retrieval) => {
      retrieval.setAttribute("gen_ai.operation.name", "retrieval");
      retrieval.setAttribute("gen_ai.data_source.id", "kb");
      retrieval.setAttribute("gen_ai.retrieval.query.text", request.question);
      retrieval.setAttribute("gen_ai.retrieval.documents", JSON.stringify(request.documents));
      retrieval.end();
    });
    tracer.startActiveSpan("chat gpt-test", (chat) => {
      chat.setAttribute("gen_ai.operation.name", "chat");
      chat.setAttribute("gen_ai.request.model", "gpt-test");
      chat.setAttribute("gen_ai.usage.input_tokens", 40);
      chat.setAttribute("gen_ai.usage.output_tokens", 6);
      chat.setAttribute(
        "gen_ai.output.messages",
        JSON.stringify([
          { role: "assistant", parts: [{ type: "text", content: request.answer }] },
        ]),
      );
      chat.end();
    });
    agent.end();
  });
}

for (const request of scenario) answer(request);
provider.shutdown().then(
  () => process.exit(0),
  (error) => {
    console.error(error);
    process.exit(1);
  },
);
