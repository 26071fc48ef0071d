-- gcra(rpm, factor, burstS): GCRA's emission interval T and tolerance tau at the current factor, in ms.
local function gcra(rpm, factor, burstS)
  local perS = rpm * factor / 60
  local T = 1000 / perS
  local burst = math.max(1, math.floor(perS * burstS))
  return T, (burst - 1) * T
end
