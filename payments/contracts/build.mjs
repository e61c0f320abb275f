#!/usr/bin/env node
// Compile Binôme's demo/test Solidity contracts FROM SOURCE with solc-js.
//
// Regenerate the committed artefacts with:   npm run build:contracts
//
// Reads every *.sol file next to this script, compiles them with solc-js's
// standard-JSON API (optimizer on, 200 runs, evmVersion "paris" so anvil and any
// chain accept the bytecode) and writes build/<ContractName>.json containing
// {abi, bytecode, contractName, solcVersion, sourceSha256} with sorted keys,
// 2-space indent and a trailing newline. The output is deterministic: rebuilding
// unchanged sources with the same (pinned) solc gives byte-identical files.
// Stale build/*.json files whose contract no longer exists are removed.
// Exits non-zero and prints the messages if solc reports any error.
// The sources are self-contained (no imports), so no import callback is needed.

import { createHash } from 'node:crypto'
import { mkdirSync, readdirSync, readFileSync, unlinkSync, writeFileSync } from 'node:fs'
import { dirname, join } from 'node:path'
import { fileURLToPath } from 'node:url'
import solc from 'solc'

const here = dirname(fileURLToPath(import.meta.url))
const outDir = join(here, 'build')

function sortKeys(value) {
  if (Array.isArray(value)) return value.map(sortKeys)
  if (value !== null && typeof value === 'object') {
    return Object.fromEntries(
      Object.keys(value).sort().map((key) => [key, sortKeys(value[key])])
    )
  }
  return value
}

const files = readdirSync(here).filter((f) => f.endsWith('.sol')).sort()
if (files.length === 0) {
  console.error(`No .sol files found in ${here}`)
  process.exit(1)
}

const sources = {}
const sourceSha256 = {}
for (const file of files) {
  const content = readFileSync(join(here, file))
  sources[file] = { content: content.toString('utf8') }
  sourceSha256[file] = createHash('sha256').update(content).digest('hex')
}

const input = {
  language: 'Solidity',
  sources,
  settings: {
    optimizer: { enabled: true, runs: 200 },
    evmVersion: 'paris',
    outputSelection: { '*': { '*': ['abi', 'evm.bytecode.object'] } },
  },
}

const output = JSON.parse(solc.compile(JSON.stringify(input)))
const solcVersion = solc.version()

const messages = output.errors ?? []
for (const msg of messages) {
  const text = msg.formattedMessage ?? `${msg.severity}: ${msg.message}`
  if (msg.severity === 'error') console.error(text)
  else console.warn(text)
}
const errors = messages.filter((m) => m.severity === 'error')
if (errors.length > 0) {
  console.error(`solc ${solcVersion}: ${errors.length} error(s); no artefacts written.`)
  process.exit(1)
}

const artefacts = new Map()
for (const file of files) {
  const contracts = output.contracts?.[file] ?? {}
  for (const [contractName, compiled] of Object.entries(contracts)) {
    const bytecode = compiled.evm?.bytecode?.object ?? ''
    if (bytecode === '') continue // interfaces / abstract contracts: nothing to deploy
    if (artefacts.has(contractName)) {
      console.error(`Duplicate contract name ${contractName} (in ${file}); names must be unique.`)
      process.exit(1)
    }
    artefacts.set(contractName, {
      abi: compiled.abi,
      bytecode: `0x${bytecode}`,
      contractName,
      solcVersion,
      sourceSha256: sourceSha256[file],
    })
  }
}

mkdirSync(outDir, { recursive: true })
const wanted = new Set([...artefacts.keys()].map((name) => `${name}.json`))
for (const existing of readdirSync(outDir)) {
  if (existing.endsWith('.json') && !wanted.has(existing)) {
    unlinkSync(join(outDir, existing))
    console.log(`removed stale build/${existing}`)
  }
}
for (const [name, artefact] of [...artefacts.entries()].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))) {
  writeFileSync(join(outDir, `${name}.json`), `${JSON.stringify(sortKeys(artefact), null, 2)}\n`)
  console.log(`wrote build/${name}.json (${(artefact.bytecode.length - 2) / 2} bytes of init code)`)
}
console.log(`solc ${solcVersion}, optimizer 200 runs, evmVersion paris`)
