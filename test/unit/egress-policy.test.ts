/**
 * The egress policy's vocabulary (services/domain/egress-policy.ts): the entry grammar, which
 * patterns are too broad for a deny default, and the decision for a destination, with its reason.
 */
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import {
  broadPatternProblem,
  EgressPolicy,
  egressPatternProblem,
  hostnameProblem,
  parseEgressEntry,
  patternMatchesHost,
} from '../../services/domain/egress-policy.ts';

const allowed = (policy: EgressPolicy, host: string, port = 443) => policy.decide(host, port).allowed;

describe('parseEgressEntry', () => {
  test('hostnames, globs, * and IPv4 addresses, lowercased without a trailing dot', () => {
    assert.deepEqual(parseEgressEntry('api.example.com'), { pattern: 'api.example.com', ports: null });
    assert.deepEqual(parseEgressEntry('API.Example.COM.'), { pattern: 'api.example.com', ports: null });
    assert.deepEqual(parseEgressEntry('*.Example.com'), { pattern: '*.example.com', ports: null });
    assert.deepEqual(parseEgressEntry('*'), { pattern: '*', ports: null });
    assert.deepEqual(parseEgressEntry('10.0.0.7'), { pattern: '10.0.0.7', ports: null });
    assert.deepEqual(parseEgressEntry('localhost'), { pattern: 'localhost', ports: null });
  });

  test('ports: one, a list (the agent snapshot form), a range; sorted, each once', () => {
    assert.deepEqual(parseEgressEntry('api.example.com:443'), { pattern: 'api.example.com', ports: [443] });
    assert.deepEqual(parseEgressEntry('api.example.com:8443,443,443'), { pattern: 'api.example.com', ports: [443, 8443] });
    assert.deepEqual(parseEgressEntry('*.example.com:8000-8003,22'), { pattern: '*.example.com', ports: [22, 8000, 8001, 8002, 8003] });
    assert.deepEqual(parseEgressEntry('10.0.0.7:5432'), { pattern: '10.0.0.7', ports: [5432] });
  });

  test('each malformed entry is a problem naming the entry', () => {
    const problems: Array<[string, RegExp]> = [
      ['', /^"" is empty/],
      ['api.*.com', /^"api\.\*\.com" has \* inside; \* may only be the whole first label/],
      ['api*.example.com', /^"api\*\.example\.com" has \* inside/],
      ['*.*', /^"\*\.\*" has \* inside/],
      ['a..example.com', /^"a\.\.example\.com" has an empty label/],
      ['.example.com', /has an empty label/],
      ['no spaces', /^"no spaces" has " ", which a hostname cannot have/],
      ['under_score.com', /has "_"/],
      ['-a.example.com', /starts or ends with "-"/],
      [`${'a'.repeat(64)}.com`, /longer than 63 characters/],
      [`${'a.'.repeat(127)}com`, /longer than 253 characters/],
      ['1.2.3', /^"1\.2\.3" is not a valid IPv4 address/],
      ['999.1.1.1', /is not a valid IPv4 address/],
      ['example.123', /ends with a number/],
      ['*.10.0.0', /is not a glob: after "\*\." it is not a valid IPv4 address/],
      ['[::1]:443', /^"\[::1\]:443" is an IPv6 address/],
      ['2001:db8::1', /is an IPv6 address/],
      ['api.example.com:', /has ":" and no port after it/],
      ['api.example.com:0', /has the port 0, out of range 1-65535/],
      ['api.example.com:65536', /has the port 65536, out of range 1-65535/],
      ['api.example.com:https', /has the port "https"; a port is a number/],
      ['api.example.com:443,', /has the port ""/],
      ['api.example.com:9000-8000', /has the range 9000-8000, whose end is below its start/],
    ];
    for (const [entry, expected] of problems) {
      const parsed = parseEgressEntry(entry);
      assert.equal(typeof parsed, 'string', `${entry} parsed as ${JSON.stringify(parsed)}`);
      assert.match(parsed as string, expected, entry);
    }
    assert.deepEqual(parseEgressEntry('api.example.com:65535'), { pattern: 'api.example.com', ports: [65535] });
    assert.deepEqual(parseEgressEntry('api.example.com:1'), { pattern: 'api.example.com', ports: [1] });
  });

  test('hostnameProblem: the spec names (dns_overrides) are strict hostnames', () => {
    assert.equal(hostnameProblem('api.example.com'), null);
    assert.equal(hostnameProblem('payments'), null);
    assert.match(hostnameProblem('1.2.3.4')!, /not a valid IPv4 address|ends with a number/);
    assert.match(hostnameProblem('bad host')!, /has " "/);
  });
});

describe('egressPatternProblem: broad patterns', () => {
  const broad = ['*', '*.com', '*.io', '*.internal', '*.co.uk', '*.com.au', '*.co.uk:443', '*.Co.UK.'];
  test('are refused under deny, naming the entry', () => {
    for (const pattern of broad) {
      const problem = egressPatternProblem(pattern, 'deny');
      assert.ok(problem, `${pattern} accepted under deny`);
      assert.ok(problem.startsWith(JSON.stringify(pattern)), problem);
      assert.match(problem, /egress\.default: allow/);
    }
    assert.match(egressPatternProblem('*.com', 'deny')!, /at least two labels after "\*\."/);
    assert.match(egressPatternProblem('*.co.uk', 'deny')!, /co\.uk is a public suffix/);
    assert.match(egressPatternProblem('*', 'deny')!, /matches every host/);
  });

  test('are accepted under allow', () => {
    for (const pattern of broad) assert.equal(egressPatternProblem(pattern, 'allow'), null, pattern);
  });

  test('a domain glob is fine under either default; syntax problems stay problems under allow', () => {
    for (const pattern of ['*.example.com', '*.example.co.uk', '*.s3.amazonaws.com', '*.corp.internal', 'com', 'api.example.com:443']) {
      assert.equal(egressPatternProblem(pattern, 'deny'), null, pattern);
      assert.equal(egressPatternProblem(pattern, 'allow'), null, pattern);
    }
    assert.match(egressPatternProblem('api.*.com', 'allow')!, /has \* inside/);
    assert.match(egressPatternProblem('x.com:0', 'allow')!, /out of range/);
  });

  test('broadPatternProblem carries no advice about the default (for brokered hosts)', () => {
    assert.match(broadPatternProblem('*.com')!, /^"\*\.com" is too broad/);
    assert.doesNotMatch(broadPatternProblem('*.com')!, /default/);
    assert.equal(broadPatternProblem('api.example.com'), null);
  });
});

describe('EgressPolicy.decide', () => {
  const policy = new EgressPolicy('deny', ['pypi.org', '*.example.com', 'api.stripe.com:443,8443', '10.0.0.7:5432', 'Files.Test.']);

  test('an exact entry matches that name only', () => {
    assert.deepEqual(policy.decide('pypi.org', 443), {
      allowed: true,
      rule: 'pypi.org',
      reason: 'egress to pypi.org:443 is allowed by the network.egress.allow entry "pypi.org"',
    });
    assert.equal(allowed(policy, 'www.pypi.org'), false);
    assert.equal(allowed(policy, 'pypi.org.evil.test'), false);
    assert.equal(allowed(policy, 'xpypi.org'), false);
  });

  test('a glob matches subdomains at any depth, not its apex nor look-alikes', () => {
    assert.equal(policy.decide('a.example.com', 443).rule, '*.example.com');
    assert.equal(allowed(policy, 'a.b.c.example.com'), true);
    assert.equal(allowed(policy, 'example.com'), false, 'the apex is not a subdomain');
    assert.equal(allowed(policy, 'badexample.com'), false);
    assert.equal(allowed(policy, 'example.com.evil.test'), false);
    assert.equal(allowed(policy, '.example.com'), false);
  });

  test('case and a trailing dot do not matter, on either side', () => {
    assert.equal(allowed(policy, 'PyPI.ORG'), true);
    assert.equal(allowed(policy, 'pypi.org.'), true);
    assert.equal(allowed(policy, 'A.Example.Com.'), true);
    assert.equal(policy.decide('files.test', 80).rule, 'Files.Test.');
  });

  test('ports: an entry with ports allows only those; the reason says which', () => {
    assert.equal(allowed(policy, 'api.stripe.com', 443), true);
    assert.equal(allowed(policy, 'api.stripe.com', 8443), true);
    assert.deepEqual(policy.decide('api.stripe.com', 22), {
      allowed: false,
      rule: null,
      reason: 'egress to api.stripe.com:22 is denied: the network.egress.allow entry "api.stripe.com:443,8443" allows only ports 443, 8443 (default deny)',
    });
    assert.equal(allowed(policy, 'pypi.org', 22), true, 'an entry without ports allows every port');
    assert.equal(policy.decide('pypi.org', 0).allowed, false);
    assert.match(policy.decide('pypi.org', 70000).reason, /70000 is not a port from 1 to 65535/);
  });

  test('IP literals match only an identical literal entry; never a name or a glob', () => {
    assert.deepEqual(policy.decide('10.0.0.7', 5432), {
      allowed: true,
      rule: '10.0.0.7:5432',
      reason: 'egress to 10.0.0.7:5432 is allowed by the network.egress.allow entry "10.0.0.7:5432"',
    });
    assert.equal(allowed(policy, '10.0.0.7', 22), false);
    assert.equal(allowed(policy, '10.0.0.8', 5432), false);
    assert.equal(allowed(policy, '::1'), false);
    assert.equal(allowed(policy, '[2001:db8::1]'), false);
    assert.match(policy.decide('2001:db8::1', 443).reason, /^egress to \[2001:db8::1\]:443 is denied: it matches no entry/);
    const open = new EgressPolicy('deny', ['*.example.com']);
    assert.equal(allowed(open, '93.184.216.34'), false, 'an address is not a subdomain, whatever it resolves to');
    assert.equal(patternMatchesHost('*', '10.0.0.7'), false);
  });

  test('no match under deny: the reason names the policy', () => {
    assert.deepEqual(policy.decide('evil.test', 443), {
      allowed: false,
      rule: null,
      reason: 'egress to evil.test:443 is denied: it matches no entry of network.egress.allow (default deny)',
    });
    assert.equal(new EgressPolicy('deny', []).decide('pypi.org', 443).allowed, false, 'an empty list under deny allows nothing');
  });

  test('a destination that is no hostname is denied, whatever the default', () => {
    for (const host of ['', 'a b', 'evil.test/x', 'a..b']) {
      const decision = new EgressPolicy('allow', []).decide(host, 80);
      assert.equal(decision.allowed, false, host);
      assert.match(decision.reason, /is not a hostname or an IP address/);
    }
    assert.equal(allowed(new EgressPolicy('allow', []), '_dmarc.example.com'), true, 'names seen on the wire may have _');
  });

  test('default allow: everything goes, an entry still names the rule; broad entries are fine there', () => {
    const all = new EgressPolicy('allow', ['*.com', 'api.example.com']);
    assert.deepEqual(all.rejected, []);
    assert.deepEqual(all.decide('anything.test', 443), {
      allowed: true,
      rule: null,
      reason: 'egress to anything.test:443 is allowed: it matches no entry of network.egress.allow (default allow)',
    });
    assert.equal(all.decide('api.example.com', 443).rule, '*.com');
    assert.equal(all.decide('1.2.3.4', 443).allowed, true);
    assert.equal(all.decide('::1', 443).allowed, true);
  });

  test('entries that do not parse or are too broad for the default are left out, listed in rejected', () => {
    const joined = new EgressPolicy('deny', ['pypi.org', '*.com:443', 'bad host', 'api.example.com:8000-8002']);
    assert.deepEqual(joined.rules, [
      { pattern: 'pypi.org', ports: null, entry: 'pypi.org' },
      { pattern: 'api.example.com', ports: [8000, 8001, 8002], entry: 'api.example.com:8000-8002' },
    ]);
    assert.deepEqual(
      joined.rejected.map((r) => r.entry),
      ['*.com:443', 'bad host'],
    );
    assert.equal(allowed(joined, 'x.com'), false);
    assert.match(joined.decide('api.example.com', 443).reason, /allows only ports 8000-8002/);
  });

  test('allowsHost: whether a name may resolve (some port allowed)', () => {
    assert.equal(policy.allowsHost('api.stripe.com'), true);
    assert.equal(policy.allowsHost('x.example.com'), true);
    assert.equal(policy.allowsHost('example.com'), false);
    assert.equal(new EgressPolicy('allow', []).allowsHost('anything.test'), true);
    assert.equal(new EgressPolicy('allow', []).allowsHost('bad host'), false);
  });
});
