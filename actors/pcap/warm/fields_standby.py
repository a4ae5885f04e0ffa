"""A warm tshark for any field list: a timeline's first call on a field list never asked before, without
tshark's start-up.

tshark takes `-e` only on its command line, so a standby of one field list (standby.py) serves that list
only, and the first timeline of every new list ran cold: 0.91x the early-stopping peer on a fresh capture
(bench/pcap_fresh.py, row T). This standby takes its list after it started, through the Lua script it waits
in (LUA): the script reads the filter and the field names, makes an extractor of each and a tap on the
filter, and writes, for each matching frame, the line `tshark -T fields -E occurrence=a` prints for it. tshark
itself runs with that filter as `-Y` (the display-filter macro, as every standby) and prints one field
no frame has (`-e diagd.none`, the script's own): the empty value and the newline that end the script's
line. So the frames are -Y's, "displayed" means what it means in the cold run (frame.time_delta_displayed),
and the tree is built as `-T fields` builds it (visible: print_details).

A value is the cold run's text where the script can make it (epan/print.c, get_node_field_value): a
FieldInfo's tostring is fvalue_to_string_repr(FTREPR_DISPLAY, display), what `-T fields` prints for all
but a few types; FT_NONE prints "1"; control characters are escaped as print_escaped_csv does. Bytes (hex
per the field's display), a protocol (its representation) and a text or data item are what the script
cannot read, so a field list runs here only when every field is of SAFE_TYPES (`servable`; the others run
cold, then on a standby of their own list), and a frame whose item is of another type (a name registered
twice, with two types) stops the run with UNSURE_EXIT before its line: the call runs cold. Occurrences come
in tree order, as -T fields walks the tree: one occurrence is read from its extractor; several are read
from the frame's whole tree in pre-order (an extractor gives them per registration of the name, in the
order they were added: ip.version of an IPv6-in-IPv4 frame came 6 then 4).

The differential test (tests/actors/pcap/test_fields_standby.py) holds every field of those types that any
corpus capture has to the cold run's text, frame by frame.
"""

from __future__ import annotations

import re
import string
from collections.abc import Sequence

from diagd.actors.pcap.shark.tshark import AGGREGATOR
from diagd.actors.pcap.shark.wireshark import COLUMN_PREFIX, Catalogue

NONE_FIELD = "diagd.none"  # the script's field that no frame has: tshark's empty line end
UNSURE_EXIT = 4  # the script met an item whose text it cannot make: the run goes cold
# The types whose -T fields text is a FieldInfo's tostring (or "1"). Not here: FT_BYTES, FT_UINT_BYTES
# (hex, separated per the field's display), FT_PROTOCOL (its representation), FT_FRAMENUM (never single
# pass: first_page.single_pass_safe), and types the corpus does not show (FT_GUID, FT_EUI64, ...).
SAFE_TYPES = frozenset({
    "FT_NONE", "FT_BOOLEAN", "FT_CHAR",
    "FT_UINT8", "FT_UINT16", "FT_UINT24", "FT_UINT32", "FT_UINT40", "FT_UINT48", "FT_UINT56", "FT_UINT64",
    "FT_INT8", "FT_INT16", "FT_INT24", "FT_INT32", "FT_INT40", "FT_INT48", "FT_INT56", "FT_INT64",
    "FT_FLOAT", "FT_DOUBLE", "FT_ABSOLUTE_TIME", "FT_RELATIVE_TIME",
    "FT_STRING", "FT_STRINGZ", "FT_UINT_STRING", "FT_STRINGZPAD", "FT_STRINGZTRUNC",
    "FT_ETHER", "FT_IPv4", "FT_IPv6", "FT_OID",
})

# Waits for two lines (the filter, the field names separated by tabs); at EOF (diagd went away) it ends
# instead of reading a capture. Field.new must run before the first frame is dissected: here, in init.
LUA = string.Template(r"""
local diagd = Proto("diagd", "diagd standby")
diagd.fields.none = ProtoField.none("$none", "none")
local display_filter = io.read("*l")
local names = display_filter and io.read("*l")
if names == nil then os.exit(1) end
local UNSURE = $unsure
local function made(ok, thing)  -- a Lua error here would leave tshark running without the tap
  if not ok then io.stderr:write("diagd: ", tostring(thing), "\n"); os.exit(UNSURE) end
  return thing
end
local index, extractors = {}, {}
for name in string.gmatch(names, "[^\t]+") do
  extractors[#extractors + 1] = made(pcall(Field.new, name))
  index[name] = #extractors  -- a name given twice: tshark fills its last column only, as here
end
local AGGREGATOR = "$aggregator"
local NONE, BYTES, UINT_BYTES, PROTOCOL = ftypes.NONE, ftypes.BYTES, ftypes.UINT_BYTES, ftypes.PROTOCOL
local ESCAPED = { ["\b"] = "\\b", ["\f"] = "\\f", ["\n"] = "\\n", ["\r"] = "\\r", ["\t"] = "\\t" }
local out = io.stdout

local function text_of(fi)
  local t = fi.type
  if t == NONE then return "1" end
  if t == BYTES or t == UINT_BYTES or t == PROTOCOL then
    io.stderr:write("diagd: no text for ", fi.name, "\n")
    os.exit(UNSURE)
  end
  return (string.gsub(tostring(fi), "[\b\f\n\r\t]", ESCAPED))
end

local tap = made(pcall(Listener.new, nil, display_filter))
local function write_row()
  local row = {}
  local several = false
  for i = 1, #extractors do
    local found = { extractors[i]() }
    if #found > 1 then several = true; break end
    row[i] = found[1] and index[found[1].name] == i and text_of(found[1]) or ""
  end
  if several then  -- tree order: the whole tree, pre-order, as -T fields walks it
    local cells = {}
    for i = 1, #extractors do cells[i] = {} end
    for _, fi in ipairs({ all_field_infos() }) do
      local i = index[fi.name]
      if i then cells[i][#cells[i] + 1] = text_of(fi) end
    end
    for i = 1, #extractors do row[i] = table.concat(cells[i], AGGREGATOR) end
  end
  out:write(table.concat(row, "\t"))  -- tshark's own empty field and newline end the line
end
-- An error in a tap is reported by tshark, which goes on: its frame's line would be empty.
function tap.packet()
  local ok, why = pcall(write_row)
  if not ok then io.stderr:write("diagd: ", tostring(why), "\n"); os.exit(UNSURE) end
end
""").substitute(none=NONE_FIELD, aggregator=AGGREGATOR, unsure=UNSURE_EXIT)


def servable(names: Sequence[str], cat: Catalogue) -> bool:
    """Whether this standby makes every field's -T fields text: each of SAFE_TYPES, none a column
    (those need a column preference) nor one of Wireshark's own `_ws.` items (expert info), and the
    tshark is the 4.0 the differential test holds it to (later ones build -T fields' tree otherwise)."""
    if not re.search(r"\b4\.0\b", cat.version):
        return False
    for name in names:
        if name.startswith(("_ws.", COLUMN_PREFIX)):
            return False
        entry = cat.fields.get(name)
        if entry is None or entry[1] not in SAFE_TYPES:
            return False
    return True


def whole_rows(lines: Sequence[str], fields: int) -> bool:
    """Whether every line is a whole row of `fields` cells (values escape their tabs): a frame the tap
    missed (tshark's tap queue was full) prints tshark's newline alone."""
    return all(line and line.count("\t") == fields - 1 for line in lines)


def go_line(display_filter: str, names: Sequence[str]) -> bytes:
    """What the script waits for: the filter, then the field names."""
    return (display_filter + "\n" + "\t".join(names) + "\n").encode()
