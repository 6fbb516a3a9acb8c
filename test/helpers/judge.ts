/** A fake of the paid judge (an OpenAI-compatible chat-completions endpoint), as a real HTTP server. */
import http from 'node:http';
import type { AddressInfo } from 'node:net';

export interface JudgeServer {
  /** The base URL to give as SVC_JUDGE_URL. */
  url: string;
  /** Every request it received: its JSON body and Authorization header. */
  calls: Array<{ body: any; auth?: string }>;
  close(): Promise<void>;
}

/** Answers each call with what `answer()` says at that moment. */
export async function judgeServer(answer: () => { status: number; body: unknown }): Promise<JudgeServer> {
  const calls: JudgeServer['calls'] = [];
  const server = http.createServer((req, res) => {
    let text = '';
    req.on('data', (d) => (text += d));
    req.on('end', () => {
      calls.push({ body: JSON.parse(text), auth: req.headers.authorization });
      const { status, body } = answer();
      res.writeHead(status, { 'content-type': 'application/json' }).end(JSON.stringify(body));
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1`, calls, close: () => new Promise((r) => server.close(() => r())) };
}

/** A chat-completions answer whose message is the judge's verdict JSON. */
export function judgeAnswer(score: number, reason = 'graded'): unknown {
  return {
    id: 'x',
    object: 'chat.completion',
    choices: [{ index: 0, message: { role: 'assistant', content: JSON.stringify({ score, reason }) }, finish_reason: 'stop' }],
  };
}
