import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { chromium, type Browser } from 'playwright-core';
import { REPO_ROOT } from './helpers.js';

/** Where browser tests leave their screenshots: gitignored, kept by CI as artefacts. */
export const ARTEFACTS = join(REPO_ROOT, 'test-artefacts');

/** Debian's chromium (never a downloaded one): $CHROMIUM, or the first on PATH. */
export function systemChromium(): string {
  const configured = process.env.CHROMIUM;
  if (configured) {
    if (!existsSync(configured)) throw new Error(`CHROMIUM=${configured} does not exist`);
    return configured;
  }
  for (const name of ['chromium', 'chromium-browser']) {
    try {
      return execFileSync('which', [name], { encoding: 'utf8' }).trim();
    } catch {
      // try the next name
    }
  }
  throw new Error("No system Chromium: install Debian's (sudo apt-get install -y chromium; .ci/run does it) or set CHROMIUM to its path.");
}

const FLAGS = [
  '--headless',
  '--no-sandbox',
  '--disable-gpu',
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync',
  '--no-first-run',
];

export async function launchBrowser(): Promise<Browser> {
  mkdirSync(ARTEFACTS, { recursive: true });
  return chromium.launch({ executablePath: systemChromium(), args: FLAGS, headless: true });
}
