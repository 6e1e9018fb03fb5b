import { createHash, createPrivateKey, generateKeyPairSync, randomBytes, sign, X509Certificate } from 'node:crypto';
import { chmodSync, closeSync, existsSync, mkdirSync, openSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { homedir } from 'node:os';
import { join } from 'node:path';
import { createSecureContext, rootCertificates, type SecureContext } from 'node:tls';
import type Forge from 'node-forge';
import { LEAF_NAMES } from './baseten-hosts.js';

const require = createRequire(import.meta.url);
// node-forge takes ~25 ms to load: only proxy mode and `loops-mock ca` need it, so a plain start does not wait for it.
let forgeModule: typeof Forge | undefined;
const forge = (): typeof Forge => (forgeModule ??= require('node-forge') as typeof Forge);

const CA_CERT = 'ca.pem';
const CA_KEY = 'ca-key.pem';
/** Node's own roots and the CA in one file, for SSL_CERT_FILE / REQUESTS_CA_BUNDLE: a client given it still trusts hosts the proxy passes through. */
const CA_BUNDLE = 'ca-bundle.pem';
const CA_YEARS = 10;
/**
 * The one leaf certificate, for every intercepted name, with its key: one file
 * (0600, it holds the key), so a reader never pairs one server's key with
 * another's certificate.
 */
const LEAF = 'leaf.pem';
/** Under the 398 days browsers accept; minted again once fewer than LEAF_RENEW_DAYS are left. */
const LEAF_DAYS = 365;
const LEAF_RENEW_DAYS = 30;
const DAY_MS = 86_400_000;

/** Where the CA lives unless --ca-dir says otherwise: a per-user folder, as mitmproxy keeps ~/.mitmproxy. */
export function defaultCaDir(env: NodeJS.ProcessEnv = process.env): string {
  const dataHome = env.XDG_DATA_HOME || join(homedir(), '.local', 'share');
  return join(dataHome, 'loops-mock', 'ca');
}

export interface CaFiles {
  dir: string;
  /** The CA certificate (PEM): what NODE_EXTRA_CA_CERTS, curl --cacert and Go's SSL_CERT_FILE need. */
  cert: string;
  /** Node's root certificates followed by the CA's: what SSL_CERT_FILE and REQUESTS_CA_BUNDLE point at. */
  bundle: string;
}

/**
 * The local certificate authority of proxy mode: made once per folder (the
 * key readable by its owner only) and reused by every later start, so a
 * client told to trust it once keeps trusting it. One leaf certificate
 * names every intercepted host (a wildcard for `*.api.baseten.co`): minted
 * once per folder and kept beside the CA, so no CONNECT, whatever name it
 * gives, costs a signature, and nothing grows with the names clients use.
 */
export class LocalCa {
  readonly files: CaFiles;
  private readonly cert: Forge.pki.Certificate;
  private readonly keyPem: string;
  private readonly certPem: string;
  private leafContext: SecureContext | null = null;

  private constructor(files: CaFiles, certPem: string, keyPem: string) {
    this.files = files;
    this.certPem = certPem;
    this.cert = forge().pki.certificateFromPem(certPem);
    // Parsed now, so that a damaged key fails the start with its folder named.
    createPrivateKey(keyPem);
    this.keyPem = keyPem;
  }

  /** The CA of `dir`: loaded when its files are there, made (and written) when not. */
  static open(dir: string): LocalCa {
    const certFile = join(dir, CA_CERT);
    const keyFile = join(dir, CA_KEY);
    const files = { dir, cert: certFile, bundle: join(dir, CA_BUNDLE) };
    if (!existsSync(certFile) || !existsSync(keyFile)) makeCaOnce(dir, certFile, keyFile);
    let certPem: string;
    let keyPem: string;
    try {
      certPem = readFileSync(certFile, 'utf8');
      keyPem = readFileSync(keyFile, 'utf8');
    } catch (err) {
      throw new Error(`cannot read the CA in ${dir}: ${(err as Error).message}`);
    }
    let ca: LocalCa;
    try {
      ca = new LocalCa(files, certPem, keyPem);
    } catch (err) {
      throw new Error(`${dir} holds no usable CA (${(err as Error).message}); remove ${CA_CERT} and ${CA_KEY} there to make a new one`);
    }
    if (ca.cert.validity.notAfter.getTime() < Date.now())
      throw new Error(`the CA in ${dir} expired on ${ca.cert.validity.notAfter.toISOString()}; remove ${CA_CERT} and ${CA_KEY} there to make a new one`);
    // The bundle follows the CA (and this Node's roots): rewritten when it differs, never trusted as found.
    const bundle = `${rootCertificates.join('\n')}\n${certPem}`;
    if (!existsSync(files.bundle) || readFileSync(files.bundle, 'utf8') !== bundle) writeAtomically(files.bundle, bundle, 0o644);
    return ca;
  }

  /** The CA certificate as PEM. */
  get pem(): string {
    return this.certPem;
  }

  /** The TLS context every intercepted connection is answered with: the leaf (from disk, or minted now), then the CA. */
  context(): SecureContext {
    if (!this.leafContext) {
      const { key, cert } = this.leaf();
      this.leafContext = createSecureContext({ key, cert: `${cert}${this.certPem}` });
    }
    return this.leafContext;
  }

  /** The leaf kept beside the CA when it is still good for it; a new one (written there) when not. */
  private leaf(): { key: string; cert: string } {
    const file = join(this.files.dir, LEAF);
    const kept = existsSync(file) ? this.usableLeaf(readFileSync(file, 'utf8')) : undefined;
    if (kept) return kept;
    // An EC key: a handshake then costs the server one P-256 signature (tens of microseconds), not an RSA one (milliseconds).
    const { privateKey, publicKey } = generateKeyPairSync('ec', {
      namedCurve: 'prime256v1',
      publicKeyEncoding: { type: 'spki', format: 'der' },
      privateKeyEncoding: { type: 'pkcs8', format: 'pem' },
    });
    const minted = { key: privateKey, cert: this.mintLeaf(publicKey) };
    try {
      writeAtomically(file, `${minted.key}${minted.cert}`, 0o600);
    } catch {
      // A CA folder this process may read but not write: the leaf still serves, minted again at the next start.
    }
    return minted;
  }

  /** Key and certificate from the leaf file, when they match, this CA signed them, they name every host and have time left. */
  private usableLeaf(text: string): { key: string; cert: string } | undefined {
    const key = /-----BEGIN PRIVATE KEY-----[^-]+-----END PRIVATE KEY-----\r?\n/.exec(text)?.[0];
    const cert = /-----BEGIN CERTIFICATE-----[^-]+-----END CERTIFICATE-----\r?\n/.exec(text)?.[0];
    if (!key || !cert) return undefined;
    try {
      const leaf = new X509Certificate(cert);
      const ca = new X509Certificate(this.certPem);
      const good =
        leaf.publicKey.asymmetricKeyType === 'ec' &&
        leaf.checkIssued(ca) &&
        leaf.verify(ca.publicKey) &&
        leaf.checkPrivateKey(createPrivateKey(key)) &&
        leaf.subjectAltName === leafSubjectAltName() &&
        Date.parse(leaf.validTo) - Date.now() > LEAF_RENEW_DAYS * DAY_MS &&
        Date.parse(leaf.validFrom) <= Date.now();
      return good ? { key, cert } : undefined;
    } catch {
      return undefined;
    }
  }

  /**
   * A certificate for the EC key `spki` (DER), signed by the CA. node-forge
   * writes RSA keys only: it builds the to-be-signed part around a stand-in
   * key, the EC key takes that key's place, and Node signs the result.
   */
  private mintLeaf(spki: Buffer): string {
    const f = forge();
    // A P-256 SubjectPublicKeyInfo ends with the 65-byte uncompressed point, what the key identifier hashes.
    const point = spki.subarray(spki.length - 65);
    if (spki.length !== 91 || point[0] !== 4) throw new Error('unexpected P-256 public key encoding');
    const cert = f.pki.createCertificate();
    cert.publicKey = this.cert.publicKey;
    cert.serialNumber = serialNumber();
    // A day back, so a client whose clock runs a little behind still accepts it.
    cert.validity.notBefore = new Date(Date.now() - DAY_MS);
    cert.validity.notAfter = new Date(Date.now() + LEAF_DAYS * DAY_MS);
    cert.setSubject([
      { name: 'commonName', value: LEAF_NAMES[0]! },
      { name: 'organizationName', value: 'loops-mock' },
    ]);
    cert.setIssuer(this.cert.subject.attributes);
    // What strict verifiers ask of a server certificate (Python 3.13's VERIFY_X509_STRICT, Go, curl): SAN, EKU, AKI.
    cert.setExtensions([
      { name: 'basicConstraints', cA: false, critical: true },
      { name: 'keyUsage', digitalSignature: true, critical: true },
      { name: 'extKeyUsage', serverAuth: true },
      { name: 'subjectAltName', altNames: LEAF_NAMES.map((value) => ({ type: 2, value })) },
      { name: 'subjectKeyIdentifier', subjectKeyIdentifier: createHash('sha1').update(point).digest('hex') },
      { name: 'authorityKeyIdentifier', keyIdentifier: this.cert.generateSubjectKeyIdentifier().getBytes() },
    ]);
    const asn1 = f.asn1;
    const signatureOid = f.pki.oids.sha256WithRSAEncryption!;
    cert.signatureOid = signatureOid;
    cert.siginfo.algorithmOid = signatureOid;
    // In node-forge, untyped: the TBSCertificate as ASN.1.
    const tbs = (f.pki as unknown as { getTBSCertificate(c: Forge.pki.Certificate): Forge.asn1.Asn1 }).getTBSCertificate(cert);
    // version, serial, signature, issuer, validity, subject, then the subject's key.
    (tbs.value as Forge.asn1.Asn1[])[6] = asn1.fromDer(spki.toString('binary'), { decodeBitStrings: false } as never);
    const tbsDer = Buffer.from(asn1.toDer(tbs).getBytes(), 'binary');
    const signature = sign('sha256', tbsDer, this.keyPem);
    const whole = asn1.create(asn1.Class.UNIVERSAL, asn1.Type.SEQUENCE, true, [
      tbs,
      asn1.create(asn1.Class.UNIVERSAL, asn1.Type.SEQUENCE, true, [
        asn1.create(asn1.Class.UNIVERSAL, asn1.Type.OID, false, asn1.oidToDer(signatureOid).getBytes()),
        asn1.create(asn1.Class.UNIVERSAL, asn1.Type.NULL, false, ''),
      ]),
      asn1.create(asn1.Class.UNIVERSAL, asn1.Type.BITSTRING, false, `\x00${signature.toString('binary')}`),
    ]);
    return new X509Certificate(Buffer.from(asn1.toDer(whole).getBytes(), 'binary')).toString();
  }
}

/** The leaf's SAN as Node's X509Certificate prints it, to tell a kept leaf made for other names. */
function leafSubjectAltName(): string {
  return LEAF_NAMES.map((name) => `DNS:${name}`).join(', ');
}

/** A positive 128-bit serial: unique per certificate, as clients that cache certificates by serial expect. */
function serialNumber(): string {
  const bytes = randomBytes(16);
  bytes[0] = bytes[0]! & 0x7f;
  return bytes.toString('hex');
}

/**
 * Makes the CA unless another process is making it now: the first to create
 * the lock file writes key and certificate; the others wait for it, so two
 * servers started at once end with one CA, not a key of one and a certificate
 * of the other.
 */
function makeCaOnce(dir: string, certFile: string, keyFile: string): void {
  try {
    mkdirSync(dir, { recursive: true, mode: 0o700 });
  } catch (err) {
    throw new Error(`cannot create the CA folder ${dir}: ${(err as Error).message} (choose another with --ca-dir)`);
  }
  const lock = join(dir, 'ca.lock');
  let fd: number;
  try {
    fd = openSync(lock, 'wx');
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'EEXIST')
      throw new Error(`cannot write in the CA folder ${dir}: ${(err as Error).message} (choose another with --ca-dir)`);
    const until = Date.now() + 10_000;
    while (existsSync(lock) && Date.now() < until) Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 50);
    if (existsSync(lock))
      throw new Error(`${lock} is still there after 10 s: another loops-mock is making the CA, or one died doing it; remove the file and start again`);
    return;
  }
  try {
    if (!existsSync(certFile) || !existsSync(keyFile)) writeNewCa(certFile, keyFile);
  } finally {
    closeSync(fd);
    rmSync(lock, { force: true });
  }
}

function writeNewCa(certFile: string, keyFile: string): void {
  const { privateKey, publicKey } = generateKeyPairSync('rsa', {
    modulusLength: 2048,
    publicKeyEncoding: { type: 'spki', format: 'pem' },
    privateKeyEncoding: { type: 'pkcs8', format: 'pem' },
  });
  const cert = forge().pki.createCertificate();
  cert.publicKey = forge().pki.publicKeyFromPem(publicKey);
  cert.serialNumber = serialNumber();
  cert.validity.notBefore = new Date(Date.now() - DAY_MS);
  cert.validity.notAfter = new Date(Date.now() + CA_YEARS * 365 * DAY_MS);
  const name = [
    { name: 'commonName', value: 'loops-mock local CA' },
    { name: 'organizationName', value: 'loops-mock' },
  ];
  cert.setSubject(name);
  cert.setIssuer(name);
  cert.setExtensions([
    { name: 'basicConstraints', cA: true, pathLenConstraint: 0, critical: true },
    { name: 'keyUsage', keyCertSign: true, cRLSign: true, critical: true },
    { name: 'subjectKeyIdentifier' },
  ]);
  cert.sign(forge().pki.privateKeyFromPem(privateKey), forge().md.sha256.create());
  // The key first: a certificate is never left without its key.
  writeAtomically(keyFile, privateKey, 0o600);
  writeAtomically(certFile, forge().pki.certificateToPem(cert), 0o644);
}

/** Written beside, then renamed: two servers starting at once never read half a file. */
function writeAtomically(file: string, text: string, mode: number): void {
  const scratch = `${file}.${process.pid}.tmp`;
  try {
    writeFileSync(scratch, text, { mode });
    chmodSync(scratch, mode);
    renameSync(scratch, file);
  } catch (err) {
    rmSync(scratch, { force: true });
    throw new Error(`cannot write ${file}: ${(err as Error).message} (choose another folder with --ca-dir)`);
  }
}
