-- Argo CD health check for frota.dev/InferenceService.
-- Healthy only when the operator has observed the current generation and the
-- Ready condition (the revision actually serving) is True for it.
local hs = { status = "Progressing", message = "Waiting for the operator to report status" }
if obj.status == nil then
  return hs
end
local generation = obj.metadata.generation
local observed = obj.status.observedGeneration
if generation ~= nil and (observed == nil or observed < generation) then
  hs.message = "Waiting for the operator to observe generation " .. generation
  return hs
end
local found = {}
for _, condition in ipairs(obj.status.conditions or {}) do
  found[condition.type] = condition
end
local function describe(condition)
  local text = condition.reason or ""
  if condition.message ~= nil and condition.message ~= "" then
    text = text .. ": " .. condition.message
  end
  return text
end
local specValid = found["SpecValid"]
if specValid ~= nil and specValid.status == "False" then
  hs.status = "Degraded"
  hs.message = describe(specValid)
  return hs
end
local ready = found["Ready"]
if ready == nil then
  return hs
end
if generation ~= nil and ready.observedGeneration ~= nil and ready.observedGeneration < generation then
  hs.message = "Ready reflects generation " .. ready.observedGeneration .. ", not " .. generation
  return hs
end
if ready.status == "True" then
  hs.status = "Healthy"
  hs.message = describe(ready)
  return hs
end
local degraded = found["Degraded"]
if degraded ~= nil and degraded.status == "True" then
  hs.status = "Degraded"
  hs.message = describe(degraded)
  return hs
end
hs.message = describe(ready)
return hs
