import { generateKeyPairSync, randomBytes } from 'node:crypto';
import { chmodSync, closeSync, existsSync, mkdirSync, openSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { homedir } from 'node:os';
import { join } from 'node:path';
import { createSecureContext, rootCertificates, type SecureContext } from 'node:tls';
import type Forge from 'node-forge';

const require = createRequire(import.meta.url);
// node-forge takes ~25 ms to load: only proxy mode and `loops-mock ca` need it, so a plain start does not wait for it.
let forgeModule: typeof Forge | undefined;
const forge = (): typeof Forge => (forgeModule ??= require('node-forge') as typeof Forge);

const CA_CERT = 'ca.pem';
const CA_KEY = 'ca-key.pem';
/** Node's own roots and the CA in one file, for SSL_CERT_FILE / REQUESTS_CA_BUNDLE: a client given it still trusts hosts the proxy passes through. */
const CA_BUNDLE = 'ca-bundle.pem';
const CA_YEARS = 10;
/** Leaves live in memory only and are minted afresh by each process, so a short life costs nothing (and stays under the 398 days browsers accept). */
const LEAF_DAYS = 365;
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
 * client told to trust it once keeps trusting it. It mints a leaf
 * certificate for each intercepted host on first use and keeps it.
 */
export class LocalCa {
  readonly files: CaFiles;
  private readonly cert: Forge.pki.Certificate;
  private readonly key: Forge.pki.rsa.PrivateKey;
  private readonly certPem: string;
  private leafKey: { forge: Forge.pki.rsa.PrivateKey; pem: string; publicKey: Forge.pki.rsa.PublicKey } | null = null;
  private readonly contexts = new Map<string, SecureContext>();

  private constructor(files: CaFiles, certPem: string, keyPem: string) {
    this.files = files;
    this.certPem = certPem;
    this.cert = forge().pki.certificateFromPem(certPem);
    this.key = forge().pki.privateKeyFromPem(keyPem) as Forge.pki.rsa.PrivateKey;
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
    if (ca.cert.validity.notAfter.getTime() < Date.now()) throw new Error(`the CA in ${dir} expired on ${ca.cert.validity.notAfter.toISOString()}; remove ${CA_CERT} and ${CA_KEY} there to make a new one`);
    // The bundle follows the CA (and this Node's roots): rewritten when it differs, never trusted as found.
    const bundle = `${rootCertificates.join('\n')}\n${certPem}`;
    if (!existsSync(files.bundle) || readFileSync(files.bundle, 'utf8') !== bundle) writeAtomically(files.bundle, bundle, 0o644);
    return ca;
  }

  /** The CA certificate as PEM. */
  get pem(): string {
    return this.certPem;
  }

  /** A TLS context presenting a certificate for `host`, minted on first use. */
  contextFor(host: string): SecureContext {
    const name = host.toLowerCase();
    let context = this.contexts.get(name);
    if (!context) {
      const leaf = this.mintLeaf(name);
      context = createSecureContext({ key: this.leafKeyPair().pem, cert: `${leaf}${this.certPem}` });
      this.contexts.set(name, context);
    }
    return context;
  }

  /** One key for every leaf of this process: minting a certificate then costs a signature, not a key generation. */
  private leafKeyPair() {
    if (!this.leafKey) {
      const { privateKey, publicKey } = generateKeyPairSync('rsa', { modulusLength: 2048, publicKeyEncoding: { type: 'spki', format: 'pem' }, privateKeyEncoding: { type: 'pkcs8', format: 'pem' } });
      this.leafKey = { pem: privateKey, forge: forge().pki.privateKeyFromPem(privateKey) as Forge.pki.rsa.PrivateKey, publicKey: forge().pki.publicKeyFromPem(publicKey) as Forge.pki.rsa.PublicKey };
    }
    return this.leafKey;
  }

  private mintLeaf(host: string): string {
    const cert = forge().pki.createCertificate();
    cert.publicKey = this.leafKeyPair().publicKey;
    cert.serialNumber = serialNumber();
    // A day back, so a client whose clock runs a little behind still accepts it.
    cert.validity.notBefore = new Date(Date.now() - DAY_MS);
    cert.validity.notAfter = new Date(Date.now() + LEAF_DAYS * DAY_MS);
    cert.setSubject([{ name: 'commonName', value: host }, { name: 'organizationName', value: 'loops-mock' }]);
    cert.setIssuer(this.cert.subject.attributes);
    // What strict verifiers ask of a server certificate (Python 3.13's VERIFY_X509_STRICT, Go, curl): SAN, EKU, AKI.
    cert.setExtensions([
      { name: 'basicConstraints', cA: false, critical: true },
      { name: 'keyUsage', digitalSignature: true, keyEncipherment: true, critical: true },
      { name: 'extKeyUsage', serverAuth: true },
      { name: 'subjectAltName', altNames: [/^[\d.]+$/.test(host) ? { type: 7, ip: host } : { type: 2, value: host }] },
      { name: 'subjectKeyIdentifier' },
      { name: 'authorityKeyIdentifier', keyIdentifier: this.cert.generateSubjectKeyIdentifier().getBytes() },
    ]);
    cert.sign(this.key, forge().md.sha256.create());
    return forge().pki.certificateToPem(cert);
  }
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
    if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw new Error(`cannot write in the CA folder ${dir}: ${(err as Error).message} (choose another with --ca-dir)`);
    const until = Date.now() + 10_000;
    while (existsSync(lock) && Date.now() < until) Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 50);
    if (existsSync(lock)) throw new Error(`${lock} is still there after 10 s: another loops-mock is making the CA, or one died doing it; remove the file and start again`);
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
  const { privateKey, publicKey } = generateKeyPairSync('rsa', { modulusLength: 2048, publicKeyEncoding: { type: 'spki', format: 'pem' }, privateKeyEncoding: { type: 'pkcs8', format: 'pem' } });
  const cert = forge().pki.createCertificate();
  cert.publicKey = forge().pki.publicKeyFromPem(publicKey);
  cert.serialNumber = serialNumber();
  cert.validity.notBefore = new Date(Date.now() - DAY_MS);
  cert.validity.notAfter = new Date(Date.now() + CA_YEARS * 365 * DAY_MS);
  const name = [{ name: 'commonName', value: 'loops-mock local CA' }, { name: 'organizationName', value: 'loops-mock' }];
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
