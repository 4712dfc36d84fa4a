// Next.js settings of the example: no telemetry, no header naming the server.
export default { poweredByHeader: false };
